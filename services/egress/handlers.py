"""The egress proxy's hooks into mitmproxy: every connection a sandbox asks for is checked
against its task's policy here (destination_check.py), refused with a 403 the agent can read,
or pinned to the address checked.

mitmproxy (a well-kept proxy whose HTTP/1, HTTP/2, CONNECT and TLS handling we use rather than
write) calls:
- `http_connect` for a CONNECT (HTTPS, git over https, any tunnel): the target is checked;
- `requestheaders` for every plain HTTP request (and any request seen inside a tunnel): its
  host is checked, so a Host header cannot lead elsewhere than the policy allows;
- `tls_clienthello` in a tunnel: a ClientHello whose SNI is the CONNECT host (or none) is
  relayed untouched, unless a secret of the task is bound to that host: then mitmproxy ends
  TLS with the deployment's CA (which the sandbox trusts), and `requestheaders` adds the
  secret to each request for that host; another SNI is not relayed blind (see there);
- `server_connect` just before mitmproxy connects: the connection goes to the checked address;
- `response`: a bound secret that a host echoes back is redacted before the sandbox sees it.
"""

from __future__ import annotations

import logging

from mitmproxy import http
from mitmproxy.net.http import url
from mitmproxy.proxy.server_hooks import ServerConnectionHookData
from mitmproxy.tls import ClientHelloData

from shared.address_policy import canonical_host

from .destination_check import checked_destination
from .errors import Refused
from .links import Link, Links
from .metrics import CONNECTIONS, SECRETS_ADDED
from .secret_headers import SecretHeaders
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
    def __init__(
        self, settings: EgressSettings, links: Links, secrets: SecretHeaders | None = None
    ) -> None:
        self.settings = settings
        self.links = links
        self.secrets = secrets or SecretHeaders(None)
        # TLS is ended only with the deployment's CA, the one sandboxes trust.
        self.intercepting = bool(settings.ca_file)

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
        # Inside a tunnel mitmproxy ended, the target is the tunnel's (checked at its CONNECT;
        # mitmproxy holds the address it was pinned to); the Host header too, where it names
        # another host than the request's target.
        target = flow.request.host
        if link.tunnel is not None and flow.request.method != "CONNECT":
            target = link.tunnel[0]
        hosts = dict.fromkeys((target, flow.request.pretty_host))
        try:
            for host in hosts:
                await self._check(link, host, flow.request.port)
        except Refused as refused:
            flow.response = _refusal(403, refused.message)
            return None
        return link

    async def http_connect(self, flow: http.HTTPFlow) -> None:
        link = await self._check_flow(flow)
        if link is None:
            return
        host, port = canonical_host(flow.request.host), flow.request.port
        link.tunnel = (host, port)
        link.bound = await self.secrets.for_host(link.sandbox.task_id, host, port)
        if link.bound and not self.intercepting:
            names = ", ".join(s.name for s in link.bound)
            link.refused = "no_egress_ca"
            link.destinations.append((host, port, False, "no_egress_ca"))
            CONNECTIONS.labels(link.tenant, "no_egress_ca").inc()
            flow.response = _refusal(
                403,
                f"the task's secret {names} is bound to {host}, but this deployment's egress "
                "proxy has no CA to add it with (its operator sets DECKHANDS_EGRESS_CA_FILE)",
            )

    async def requestheaders(self, flow: http.HTTPFlow) -> None:
        if flow.request.method == "CONNECT" or flow.response is not None:
            return
        link = await self._check_flow(flow)
        if link is not None and link.bound and link.secrets_ok and flow.request.scheme == "https":
            self._add_secrets(link, flow)

    def _add_secrets(self, link: Link, flow: http.HTTPFlow) -> None:
        """The bound secrets, into a request inside a tunnel this proxy ended, when the request
        is for the tunnel's own host (its Host header and authority), never another."""
        assert link.tunnel is not None
        request = flow.request
        # The authority the request names (its Host header, or HTTP/2's :authority), port
        # included: the tunnel's, or nothing is added.
        named_host, named_port = url.parse_authority(request.host_header or "", check=False)
        named = (canonical_host(named_host), named_port or url.default_port("https"))
        if named != link.tunnel:
            return
        added = []
        for secret in link.bound:
            assert secret.egress is not None
            request.headers[secret.egress.header] = secret.egress.header_value(secret.value)
            added.append(secret)
            link.secrets_added.add(secret.name)
            SECRETS_ADDED.labels(link.tenant).inc()
        flow.metadata["deckhands_secrets"] = added

    def response(self, flow: http.HTTPFlow) -> None:
        """A bound secret echoed back by its host (a debug endpoint, an error page) is
        redacted, so that the sandbox never holds it; a body streamed through (over 256 KiB)
        is not read."""
        added = flow.metadata.get("deckhands_secrets")
        if not added or flow.response is None:
            return
        response = flow.response
        for secret in added:
            marker = f"<secret:{secret.name}>"
            for name, value in list(response.headers.items(multi=True)):
                if secret.value in value:
                    response.headers[name] = value.replace(secret.value, marker)
            if response.stream or response.raw_content is None:
                continue
            body = response.get_content(strict=False) or b""
            if secret.value.encode() in body:
                response.set_content(body.replace(secret.value.encode(), marker.encode()))

    def tls_clienthello(self, data: ClientHelloData) -> None:
        link = self.links.of(data.context.client.peername)
        sni = data.client_hello.sni
        tunnel = link.tunnel if link is not None else None
        if tunnel is not None and (sni is None or canonical_host(sni) == tunnel[0]):
            if link is not None and link.bound and self.intercepting:
                # Ended here with the deployment's CA, to add the task's secrets.
                link.secrets_ok = True
                return
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
