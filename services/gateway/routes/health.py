"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from ..context import ReadinessServiceDep
from ..health.models import ReadinessReport

__all__ = ["router"]

router = APIRouter(tags=["operations"])


@router.get("/healthz", summary="The process is alive")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get(
    "/readyz",
    response_model=ReadinessReport,
    responses={503: {"model": ReadinessReport, "description": "NATS or Redis is not reachable"}},
    summary="NATS and Redis are reachable",
)
async def readyz(readiness: ReadinessServiceDep) -> JSONResponse:
    report = await readiness.check()
    body = report.model_dump()
    if not report.ready:
        failed = ", ".join(name for name, result in report.checks.items() if result != "ok")
        body["detail"] = f"not ready: {failed} unavailable"
    return JSONResponse(status_code=200 if report.ready else 503, content=body)


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
async def metrics() -> Response:
    return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)
