"""The egress proxy's hooks into mitmproxy: every connection a sandbox asks for is checked
against its task's policy here (destination_check.py), refused with a 403 the agent can read,
or pinned to the address checked.

mitmproxy (a well-kept proxy whose HTTP/1, HTTP/2, CONNECT and TLS handling we use rather than
write) calls:
- `http_connect` for a CONNECT (HTTPS, git over https, any tunnel): the target is checked;
- `requestheaders` for every plain HTTP request (and any request seen inside a tunnel): its
  host is checked, so a Host header cannot lead elsewhere than the policy allows;
- `tls_clienthello` in a tunnel: a ClientHello whose SNI is the CONNECT host (or none) is
  relayed untouched; another SNI is not (see there);
- `server_connect` just before mitmproxy connects: the connection goes to the checked address.
"""

from __future__ import annotations

import logging

from mitmproxy import http
from mitmproxy.proxy.server_hooks import ServerConnectionHookData
from mitmproxy.tls import ClientHelloData

from shared.address_policy import canonical_host

from .destination_check import checked_destination
from .errors import Refused
from .links import Link, Links
from .metrics import CONNECTIONS
from .settings import EgressSettings

__all__ = ["EgressHandlers"]

log = logging.getLogger("deckhands.egress")


def _refusal(status: int, message: str) -> http.Response:
    return http.Response.make(
        status,
        f"deckhands egress proxy: {message}\n".encode(),
        {"Content-Type": "text/plain; charset=utf-8", "X-Deckhands-Egress": "refused"},
    )


class EgressHandlers:
    def __init__(self, settings: EgressSettings, links: Links) -> None:
        self.settings = settings
        self.links = links

    async def _check(self, link: Link, host: str, port: int) -> str:
        key = (canonical_host(host), port)
        pinned = link.pinned.get(key)
        if pinned is not None:
            return pinned
        try:
            address = await checked_destination(
                link.sandbox.network, host, port, self.settings.connect_timeout_s
            )
        except Refused as refused:
            CONNECTIONS.labels(link.tenant, refused.reason).inc()
            link.refused = refused.reason
            link.destinations.append((key[0], port, False, refused.reason))
            log.info(
                "task %s: egress to %s:%s refused (%s)",
                link.sandbox.task_id,
                key[0],
                port,
                refused.reason,
            )
            raise
        link.pinned[key] = address
        link.destinations.append((key[0], port, True, ""))
        CONNECTIONS.labels(link.tenant, "allowed").inc()
        return address

    async def _check_flow(self, flow: http.HTTPFlow) -> Link | None:
        link = self.links.of(flow.client_conn.peername)
        if link is None:
            flow.response = _refusal(403, "this connection is not from a known sandbox")
            return None
        # The Host header too, where it names another host than the request's target.
        hosts = dict.fromkeys((flow.request.host, flow.request.pretty_host))
        try:
            for host in hosts:
                await self._check(link, host, flow.request.port)
        except Refused as refused:
            flow.response = _refusal(403, refused.message)
            return None
        return link

    async def http_connect(self, flow: http.HTTPFlow) -> None:
        link = await self._check_flow(flow)
        if link is not None:
            link.tunnel = (canonical_host(flow.request.host), flow.request.port)

    async def requestheaders(self, flow: http.HTTPFlow) -> None:
        if flow.request.method == "CONNECT" or flow.response is not None:
            return
        await self._check_flow(flow)

    def tls_clienthello(self, data: ClientHelloData) -> None:
        link = self.links.of(data.context.client.peername)
        sni = data.client_hello.sni
        tunnel = link.tunnel if link is not None else None
        if tunnel is not None and (sni is None or canonical_host(sni) == tunnel[0]):
            data.ignore_connection = True  # relayed as it is: the sandbox's TLS, end to end
            return
        # Another name than the one checked (domain fronting): not relayed blind. mitmproxy
        # then ends TLS itself with a certificate the sandbox does not trust, and any request
        # a client sends anyway goes through `requestheaders`, checked by its own host.
        if link is not None:
            CONNECTIONS.labels(link.tenant, "sni_mismatch").inc()
            link.destinations.append((canonical_host(sni or "-"), 0, False, "sni_mismatch"))
            log.info("task %s: TLS name %r is not the tunnel's", link.sandbox.task_id, sni)

    async def server_connect(self, data: ServerConnectionHookData) -> None:
        link = self.links.of(data.client.peername)
        if link is None or data.server.address is None:
            data.server.error = "not from a known sandbox"
            return
        host, port = data.server.address
        try:
            data.server.address = (await self._check(link, host, port), port)
        except Refused as refused:
            data.server.error = refused.message
