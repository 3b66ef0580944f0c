"""A Modbus TCP server for the gateway's tests: pymodbus's server (PyPI
pymodbus, installed by scripts/test.sh into target/py-venv), unit 1, with
known values, driven through stdin by the test.

    python modbus_peer.py PORT
    python modbus_peer.py rtu TTY    (an RTU server on a serial port; units
                                      1 and 2; no commands)
    python modbus_peer.py many PORT,... REGS   (one server per port, in this
                                      one process, each with REGS holding
                                      registers counting up; no commands:
                                      scripts/bench-modbus.sh)
    python modbus_peer.py relay TTY_MASTER TTY_SLAVE   (relays an RTU
                                      line between two serial ports, and
                                      spoils the slave's answers on command)

Prints "ready" once it serves. Then one command a line, each answered with
one line ("ok", or the values asked for), all carried out by pymodbus's own
client against the server, so the values go through the protocol:
    set-hr ADDR V...   write holding registers
    set-co ADDR 0|1    write a coil
    get-hr ADDR N      read holding registers
    get-co ADDR N      read coils
"""

import asyncio
import sys

from pymodbus.client import AsyncModbusTcpClient
from pymodbus.datastore import (
    ModbusDeviceContext,
    ModbusSequentialDataBlock,
    ModbusServerContext,
)
from pymodbus import FramerType
from pymodbus.server import ModbusSerialServer, ModbusTcpServer


def context():
    return ModbusServerContext(devices={1: device()}, single=False)


def device():
    # holding: 0 = 1234 (u16), 1 = 0xFF38 (i16 -200), 2..3 = f32 230.5,
    # 4..5 = f32 0.25 with the low register first, 10 = a setpoint,
    # 20 = 0x8005 (bits 0, 2, 15 set); coils: 3 = on
    hr = [0] * 32
    hr[0] = 1234
    hr[1] = 0xFF38
    hr[2], hr[3] = 0x4366, 0x8000
    hr[4], hr[5] = 0x0000, 0x3E80
    hr[20] = 0x8005
    ir = [0] * 16
    ir[0] = 650  # 25.0 with scale 0.1 and offset -40
    co = [False] * 16
    co[3] = True
    return ModbusDeviceContext(
        hr=ModbusSequentialDataBlock(1, hr),
        ir=ModbusSequentialDataBlock(1, ir),
        co=ModbusSequentialDataBlock(1, co),
        di=ModbusSequentialDataBlock(1, [False] * 16),
    )


async def rtu(tty):
    # unit 2 holds 2222 in holding register 0; a unit not on the bus gets
    # no answer, as on a real line
    hr = [0] * 32
    hr[0] = 2222
    two = ModbusDeviceContext(hr=ModbusSequentialDataBlock(1, hr))
    server = ModbusSerialServer(
        ModbusServerContext(devices={1: device(), 2: two}, single=False),
        framer=FramerType.RTU,
        port=tty,
        baudrate=19200,
        parity="N",  # a pty refuses a parity setting (EINVAL)
        ignore_missing_devices=True,
    )
    serving = asyncio.create_task(server.serve_forever())
    await asyncio.sleep(0.5)
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)
    serving.cancel()


def relay(master_tty, slave_tty):
    # A faulty line between the gateway (master) and the slave. Commands,
    # each answered "ok": "pass" relays as is; "crc" flips bits of the last
    # byte of each chunk the slave sends (a CRC error); "garbage" sends
    # random bytes in place of the slave's answer (line noise); "late MS"
    # holds each answer for MS milliseconds before relaying it.
    import os
    import random
    import select
    import threading
    import time
    import tty

    fds = []
    for path in (master_tty, slave_tty):
        fd = os.open(path, os.O_RDWR | os.O_NOCTTY)
        tty.setraw(fd)
        fds.append(fd)
    master, slave = fds
    mode = ["pass", 0.0]

    def commands():
        for line in sys.stdin:
            words = line.split()
            mode[1] = int(words[1]) / 1000 if words[0] == "late" else 0.0
            mode[0] = words[0]
            print("ok", flush=True)
        os._exit(0)

    threading.Thread(target=commands, daemon=True).start()
    print("ready", flush=True)
    rng = random.Random(26)
    while True:
        ready, _, _ = select.select([master, slave], [], [])
        if master in ready:
            os.write(slave, os.read(master, 4096))
        if slave in ready:
            data = os.read(slave, 4096)
            if mode[0] == "crc":
                data = data[:-1] + bytes([data[-1] ^ 0x55])
            elif mode[0] == "garbage":
                data = bytes(rng.randrange(256) for _ in range(len(data)))
            elif mode[0] == "late":
                time.sleep(mode[1])
            os.write(master, data)


async def main(port):
    server = ModbusTcpServer(context(), address=("127.0.0.1", port))
    serving = asyncio.create_task(server.serve_forever())
    client = AsyncModbusTcpClient("127.0.0.1", port=port, timeout=2, retries=0)
    for _ in range(100):
        if await client.connect():
            break
        await asyncio.sleep(0.05)
    else:
        raise SystemExit("the server did not start")
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            break
        cmd, *args = line.split()
        a = [int(x) for x in args]
        if cmd == "set-hr":
            r = await client.write_registers(a[0], a[1:], device_id=1)
            out = "ok"
        elif cmd == "set-co":
            r = await client.write_coil(a[0], bool(a[1]), device_id=1)
            out = "ok"
        elif cmd == "get-hr":
            r = await client.read_holding_registers(a[0], count=a[1], device_id=1)
            out = " ".join(str(v) for v in getattr(r, "registers", []))
        elif cmd == "get-co":
            r = await client.read_coils(a[0], count=a[1], device_id=1)
            out = " ".join(str(int(v)) for v in getattr(r, "bits", [])[: a[1]])
        else:
            raise SystemExit(f"unknown command {cmd}")
        print(f"error {r}" if r.isError() else out, flush=True)
    client.close()
    serving.cancel()


async def many(ports, regs):
    servers = []
    for port in ports:
        block = ModbusSequentialDataBlock(1, [i % 65536 for i in range(regs)])
        ctx = ModbusServerContext(devices={1: ModbusDeviceContext(hr=block)}, single=False)
        server = ModbusTcpServer(ctx, address=("127.0.0.1", port))
        servers.append(asyncio.create_task(server.serve_forever()))
    await asyncio.sleep(0.5)
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)
    for s in servers:
        s.cancel()


if __name__ == "__main__":
    if sys.argv[1] == "many":
        asyncio.run(many([int(p) for p in sys.argv[2].split(",")], int(sys.argv[3])))
    elif sys.argv[1] == "relay":
        relay(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "rtu":
        asyncio.run(rtu(sys.argv[2]))
    else:
        asyncio.run(main(int(sys.argv[1])))
