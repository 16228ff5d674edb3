"""Recurring schedules: cron expressions and fixed intervals, in time zones."""
