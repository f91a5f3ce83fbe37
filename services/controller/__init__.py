"""controller: the AgentController of seed 001, one event at a time, with no memory of its own."""
