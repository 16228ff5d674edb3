"""facade"""
