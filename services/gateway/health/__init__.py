"""Whether the gateway can serve: NATS and Redis answering."""
