# An order service as a twistd .tac file: `twistd -y` exec()s it in a dict with __file__ set, so
# its globals are no module's (nothing in sys.modules holds them). handle_order() builds each
# order's 16 KiB payload; one order in 5 fails validation and the except branch keeps the payload
# in the global list `failed`, which nothing trims (held growth). Run by pytac.py.

failed = []


def validate(order_id, payload):
    if order_id % 5 == 0:
        raise ValueError(f"order {order_id}: bad checksum")


def handle_order(order_id):
    payload = bytearray(16384)
    payload[:16] = order_id.to_bytes(16, "little")
    try:
        validate(order_id, payload)
    except ValueError:
        failed.append(payload)  # kept "for a retry" that never comes
