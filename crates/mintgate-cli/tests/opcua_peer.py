"""An OPC UA server for the gateway's tests: asyncua's (PyPI asyncua,
installed by scripts/test.sh into target/py-venv), with known variables in
namespace 2, driven through stdin by the test.

    python opcua_peer.py PORT [--certs DIR] [--user NAME:PASSWORD]

Endpoint: opc.tcp://127.0.0.1:PORT/mintgate/. Without --certs it offers
security policy None only; with --certs (DIR/server.der, DIR/server.pem) it
offers None, Basic256Sha256 Sign and Basic256Sha256 SignAndEncrypt. With
--user it refuses anonymous sessions and takes that user and password only.

Prints "ready" once it serves. Then one command a line, each answered with
one line, carried out on the server's own address space:
    set NAME VALUE   set a variable (in its own type)
    get NAME         its value
    sessions         how many sessions were activated
"""

import asyncio
import logging
import sys

from asyncua import Server, ua
from asyncua.crypto.permission_rules import User, UserRole

logging.basicConfig(level=logging.ERROR)

# name: (string or numeric identifier, variant type, first value, writable)
VARIABLES = {
    "Temperature": ("Temperature", ua.VariantType.Double, 21.5, False),
    "Count": ("Count", ua.VariantType.Int32, 1234, False),
    "Level": ("Level", ua.VariantType.Float, 0.25, False),
    "Raw": (1001, ua.VariantType.UInt16, 650, False),
    "Running": ("Running", ua.VariantType.Boolean, True, False),
    "Setpoint": ("Setpoint", ua.VariantType.Int16, 0, True),
    "Relay": ("Relay", ua.VariantType.Boolean, False, True),
    "Speed": ("Speed", ua.VariantType.Double, 0.0, True),
    "Name": ("Name", ua.VariantType.String, "pump", False),
}

activated = 0


class Users:
    def __init__(self, user, password):
        self.user, self.password = user, password

    def get_user(self, iserver, username=None, password=None, certificate=None):
        global activated
        if self.user is None or (username == self.user and password == self.password):
            activated += 1
            return User(role=UserRole.User)
        return None


async def main():
    args = sys.argv[1:]
    port = int(args[0])
    certs = args[args.index("--certs") + 1] if "--certs" in args else None
    user, password = None, None
    if "--user" in args:
        user, password = args[args.index("--user") + 1].split(":", 1)
    server = Server(user_manager=Users(user, password))
    await server.init()
    server.set_endpoint(f"opc.tcp://127.0.0.1:{port}/mintgate/")
    server.set_server_name("mintgate test server")
    await server.set_application_uri("urn:mintgate:test-server")
    policies = [ua.SecurityPolicyType.NoSecurity]
    if certs:
        await server.load_certificate(f"{certs}/server.der")
        await server.load_private_key(f"{certs}/server.pem")
        policies += [
            ua.SecurityPolicyType.Basic256Sha256_Sign,
            ua.SecurityPolicyType.Basic256Sha256_SignAndEncrypt,
        ]
    server.set_security_policy(policies)
    if user is not None:
        server.set_identity_tokens([ua.UserNameIdentityToken])
    else:
        server.set_identity_tokens([ua.AnonymousIdentityToken])
    idx = await server.register_namespace("urn:mintgate:test")
    assert idx == 2, idx
    objects = server.nodes.objects
    nodes = {}
    for name, (ident, vt, value, writable) in VARIABLES.items():
        node = await objects.add_variable(ua.NodeId(ident, idx), name, ua.Variant(value, vt))
        if writable:
            await node.set_writable()
        nodes[name] = (node, vt)
    async with server:
        print("ready", flush=True)
        loop = asyncio.get_running_loop()
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                return
            cmd = line.split()
            if not cmd:
                continue
            try:
                if cmd[0] == "set":
                    node, vt = nodes[cmd[1]]
                    text = cmd[2]
                    if vt == ua.VariantType.Boolean:
                        value = text in ("1", "true", "True")
                    elif vt in (ua.VariantType.Double, ua.VariantType.Float):
                        value = float(text)
                    elif vt == ua.VariantType.String:
                        value = text
                    else:
                        value = int(text)
                    await node.write_value(ua.Variant(value, vt))
                    print("ok", flush=True)
                elif cmd[0] == "get":
                    node, _ = nodes[cmd[1]]
                    print(await node.read_value(), flush=True)
                elif cmd[0] == "sessions":
                    print(activated, flush=True)
                else:
                    print(f"unknown command {cmd[0]}", flush=True)
            except Exception as e:  # the test reads the line
                print(f"error {e}", flush=True)


asyncio.run(main())
