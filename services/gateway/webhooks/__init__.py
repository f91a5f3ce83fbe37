"""Webhooks: what a task or tenant asks for, the record of every attempt, and their delivery."""
