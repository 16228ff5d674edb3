"""Transactional messages: half messages, op messages and the check loop."""
