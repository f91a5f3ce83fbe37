"""The HTTP routes, one module per resource: HTTP in, a service called, HTTP out."""
