"""What every route shares: authentication, bounded requests, trusted hosts, observability,
Server-Sent Events framing, and the bodies every answer has in common."""
