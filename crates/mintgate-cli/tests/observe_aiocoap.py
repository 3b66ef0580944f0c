"""Observes a URI with aiocoap (RFC 7641; over coap+ws, coap+tcp or UDP,
as the URI says) and prints one line per message, flushed at once:
`first CODE OBSERVE PAYLOAD` for the response, then `note OBSERVE PAYLOAD`
for each notification. Runs until it is killed: the test ends the
observation by closing the connection, not by deregistering. With
CREDENTIALS (aiocoap's credentials JSON) the observation is OSCORE
protected (RFC 8613): only notifications aiocoap verified are printed, and
their OBSERVE is their Partial IV (-1 for an answer without one).
(aiocoap-client --observe of aiocoap 0.4.17 cancels the observation after
the first answer, hence this script.)

Usage: observe_aiocoap.py URI [CREDENTIALS]
"""
import asyncio
import json
import sys

import aiocoap


async def main(uri, credentials=None):
    ctx = await aiocoap.Context.create_client_context()
    if credentials:
        with open(credentials) as f:
            ctx.client_credentials.load_from_dict(json.load(f))
    pr = ctx.request(aiocoap.Message(code=aiocoap.GET, uri=uri, observe=0))
    first = await pr.response
    print("first", first.code, first.opt.observe, first.payload.decode(), flush=True)
    async for r in pr.observation:
        print("note", r.opt.observe, r.payload.decode(), flush=True)


asyncio.run(main(*sys.argv[1:3]))
