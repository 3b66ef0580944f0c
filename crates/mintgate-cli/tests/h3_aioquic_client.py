"""A third-party HTTP/3 client (aioquic) for mintgate's interoperability test.

Usage: h3_aioquic_client.py HOST PORT CAFILE PATH

Makes three connections to the HTTP/3 proxy:
  1. a full handshake and GET PATH (keeps the session ticket);
  2. a resumed connection sending GET PATH as 0-RTT early data;
  3. a resumed connection sending POST PATH as 0-RTT early data.
Prints one JSON object per request on stdout:
  {"step": N, "method": M, "status": S, "body": "...", "early_data": bool}
where early_data says whether the server accepted the 0-RTT data.
"""

import asyncio
import json
import sys

from aioquic.asyncio import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration


class H3Client(QuicConnectionProtocol):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.h3 = H3Connection(self._quic)
        self.pending = {}
        self.partial = {}

    def quic_event_received(self, event):
        for ev in self.h3.handle_event(event):
            if isinstance(ev, (HeadersReceived, DataReceived)):
                got = self.partial.setdefault(ev.stream_id, {"headers": [], "body": b""})
                if isinstance(ev, HeadersReceived):
                    got["headers"] = ev.headers
                else:
                    got["body"] += ev.data
                if ev.stream_ended and ev.stream_id in self.pending:
                    self.pending.pop(ev.stream_id).set_result(self.partial.pop(ev.stream_id))

    async def request(self, method, authority, path, body=b""):
        sid = self._quic.get_next_available_stream_id()
        self.h3.send_headers(
            sid,
            [
                (b":method", method.encode()),
                (b":scheme", b"https"),
                (b":authority", authority.encode()),
                (b":path", path.encode()),
            ],
            end_stream=not body,
        )
        if body:
            self.h3.send_data(sid, body, end_stream=True)
        done = self._loop.create_future()
        self.pending[sid] = done
        self.transmit()
        return await asyncio.wait_for(done, 10)


def config(cafile, ticket=None):
    c = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN, server_name="localhost")
    c.load_verify_locations(cafile)
    c.session_ticket = ticket
    return c


async def one(step, host, port, cafile, path, method, ticket, tickets):
    async with connect(
        host,
        port,
        configuration=config(cafile, ticket),
        create_protocol=H3Client,
        session_ticket_handler=tickets.append,
        wait_connected=ticket is None,
    ) as client:
        got = await client.request(method, f"localhost:{port}", path, b"x" if method == "POST" else b"")
        status = dict(got["headers"]).get(b":status", b"0").decode()
        early = bool(getattr(client._quic.tls, "early_data_accepted", False))
        print(json.dumps({
            "step": step,
            "method": method,
            "status": int(status),
            "body": got["body"].decode(errors="replace"),
            "early_data": early,
        }), flush=True)


async def main():
    host, port, cafile, path = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    tickets = []
    await one(1, host, port, cafile, path, "GET", None, tickets)
    if not tickets:
        print(json.dumps({"error": "no session ticket received"}), flush=True)
        return
    # Tickets are single-use (the server takes each out of its store), so
    # every resumption uses one not used before.
    await one(2, host, port, cafile, path, "GET", tickets.pop(), tickets)
    await one(3, host, port, cafile, path, "POST", tickets.pop(), tickets)


asyncio.run(main())
