"""storage: keeps every task's event log durably and answers history queries."""
