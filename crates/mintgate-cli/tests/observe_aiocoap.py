"""Observes a URI with aiocoap (RFC 7641; over coap+ws, coap+tcp or UDP,
as the URI says) and prints one line per message, flushed at once:
`first CODE OBSERVE PAYLOAD` for the response, then `note OBSERVE PAYLOAD`
for each notification. Runs until it is killed: the test ends the
observation by closing the connection, not by deregistering.

Usage: observe_aiocoap.py URI
"""
import asyncio
import sys

import aiocoap


async def main(uri):
    ctx = await aiocoap.Context.create_client_context()
    pr = ctx.request(aiocoap.Message(code=aiocoap.GET, uri=uri, observe=0))
    first = await pr.response
    print("first", first.code, first.opt.observe, first.payload.decode(), flush=True)
    async for r in pr.observation:
        print("note", r.opt.observe, r.payload.decode(), flush=True)


asyncio.run(main(sys.argv[1]))
