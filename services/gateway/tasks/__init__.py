"""Tasks: creating them and sending them user input, finding, listing and deleting them, and the
gateway's records of them."""
