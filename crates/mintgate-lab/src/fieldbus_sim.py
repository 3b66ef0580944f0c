"""The simulated field devices of `mintgate lab fieldbus`: pymodbus's TCP
server (PyPI pymodbus), one server per port, all in this one process.

    python fieldbus_sim.py PORT,... REGS RELAY_PORT

Each server on PORT,... is unit 1 with REGS holding registers (0-based
addresses 0..REGS-1) counting up; the server on RELAY_PORT holds 16 coils.
Prints "ready" once every server listens. Then reads commands from stdin,
one a line:

    set DEV ADDR VALUE   holding register ADDR of device DEV (0-based index
                         in PORT,...) is set to VALUE in the server's own
                         datastore; prints "set DEV ADDR VALUE T"

and reports, one line each, on stdout:

    read DEV ADDR T      the first read request that covered a register
                         after a set of it (the poll that picked it up)
    coil ADDR VALUE T    a write of a coil of the relay server

T is CLOCK_MONOTONIC in nanoseconds (time.monotonic_ns(), the clock the
lab reads too), taken in the server's own event loop: for a set, just
after the datastore holds the new value; for a read, just before the
server reads its datastore to answer; for a coil, just after it wrote it.
"""

import asyncio
import sys
import time

from pymodbus.datastore import (
    ModbusDeviceContext,
    ModbusSequentialDataBlock,
    ModbusServerContext,
)
from pymodbus.server import ModbusTcpServer


def out(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class Tap:
    """Sits between a server and its datastore and reports what the lab
    measures."""

    def __init__(self, inner, dev):
        self.inner = inner
        self.dev = dev
        self.watch = set()

    async def async_getValues(self, device_id, func_code, address, count=1):
        if self.watch and func_code in (3, 23):
            t = time.monotonic_ns()
            for a in [a for a in self.watch if address <= a < address + count]:
                self.watch.discard(a)
                out(f"read {self.dev} {a} {t}")
        return await self.inner.async_getValues(device_id, func_code, address, count)

    async def async_setValues(self, device_id, func_code, address, values):
        r = await self.inner.async_setValues(device_id, func_code, address, values)
        if self.dev == "relay" and func_code in (5, 15):
            t = time.monotonic_ns()
            for i, v in enumerate(values):
                out(f"coil {address + i} {int(bool(v))} {t}")
        return r

    def __getattr__(self, name):
        return getattr(self.inner, name)


def server(port, dev, **blocks):
    ctx = ModbusServerContext(devices={1: ModbusDeviceContext(**blocks)}, single=False)
    s = ModbusTcpServer(ctx, address=("127.0.0.1", port))
    s.context = Tap(s.context, dev)
    return s


async def main(ports, regs, relay_port):
    servers = []
    for i, port in enumerate(ports):
        hr = ModbusSequentialDataBlock(1, [a % 65536 for a in range(regs)])
        servers.append(server(port, str(i), hr=hr))
    servers.append(server(relay_port, "relay", co=ModbusSequentialDataBlock(1, [False] * 16)))
    tasks = [asyncio.create_task(s.serve_forever()) for s in servers]
    for _ in range(200):
        if all(s.transport for s in servers):
            break
        await asyncio.sleep(0.025)
    else:
        raise SystemExit("the servers did not listen")
    out("ready")
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            break
        cmd, *args = line.split()
        if cmd != "set":
            raise SystemExit(f"unknown command {cmd}")
        dev, addr, value = (int(x) for x in args)
        tap = servers[dev].context
        await tap.inner.async_setValues(1, 6, addr, [value])
        t = time.monotonic_ns()
        tap.watch.add(addr)
        out(f"set {dev} {addr} {value} {t}")
    for t in tasks:
        t.cancel()


if __name__ == "__main__":
    asyncio.run(
        main(
            [int(p) for p in sys.argv[1].split(",")],
            int(sys.argv[2]),
            int(sys.argv[3]),
        )
    )
