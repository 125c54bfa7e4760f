#!/usr/bin/env python3
"""`mongosh --quiet --eval "db.adminCommand('ping').ok"` for the FerretDB test image.

The chart's mongodb readiness probe runs that command; this stand-in sends the
same `ping` (an OP_MSG on 127.0.0.1:27017) and exits 0 only when the server
answers ok: 1. Any other `--eval` is refused.
"""

import socket
import struct
import sys

OP_MSG = 2013


def bson_ping() -> bytes:
    body = b"\x10ping\x00" + struct.pack("<i", 1)
    body += b"\x02$db\x00" + struct.pack("<i", 6) + b"admin\x00"
    return struct.pack("<i", len(body) + 5) + body + b"\x00"


def main() -> int:
    if "db.adminCommand('ping').ok" not in sys.argv[1:]:
        print("mongosh stand-in: only --eval \"db.adminCommand('ping').ok\"", file=sys.stderr)
        return 2
    payload = struct.pack("<I", 0) + b"\x00" + bson_ping()
    msg = struct.pack("<iiii", 16 + len(payload), 1, 0, OP_MSG) + payload
    with socket.create_connection(("127.0.0.1", 27017), timeout=4) as sock:
        sock.sendall(msg)
        head = sock.recv(16, socket.MSG_WAITALL)
        (length,) = struct.unpack("<i", head[:4])
        reply = sock.recv(length - 16, socket.MSG_WAITALL)
    at = reply.find(b"\x01ok\x00")
    ok = at >= 0 and struct.unpack("<d", reply[at + 4 : at + 12])[0] == 1.0
    print(1 if ok else 0)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
