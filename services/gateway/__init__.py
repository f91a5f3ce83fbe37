"""The gateway: deckhands' HTTP API v1 (FastAPI on uvicorn).

Routers (`*_router.py`) speak HTTP only; services (`*_service.py`, `history.py`) hold the logic.
"""

__all__: list[str] = []
