"""The gateway: deckhands' HTTP API v1 (FastAPI on uvicorn).

`routes/` speaks HTTP only, one module per resource; each resource's logic lives in a folder of
its own (tasks, events, tenants, quotas, secrets, webhooks, workspace, health): `service.py` what
the routes call, `models.py` its bodies, `records.py` or `store.py` what it keeps. `http/` holds
what every route shares; `context.py` builds the services, `main.py` wires the app.
"""

__all__: list[str] = []
