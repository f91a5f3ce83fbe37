"""agent-reasoner: builds the prompt from a task's history, asks the LLM, answers one Action."""
