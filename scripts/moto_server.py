"""moto's server with one fidelity fix to its SQS FIFO groups.

moto 5.2.5 counts a FIFO group as held while any of its messages is in its
pending set, even one whose visibility timeout has run out. When several of
a group's messages time out together (a consumer that died or gave up with
a batch in hand), ReceiveMessage walks them in order, drops each from the
pending set as it passes, skips it because the ones behind it are still
"pending", and so delivers the group from its *last* timed-out message:
m2 before m0 and m1. Real SQS delivers the group again from m0. The fix
counts only messages still in flight (invisible) as holding their group.

Run exactly like moto_server: `python moto_server.py -H 127.0.0.1 -p 4566`.
"""

import sys

from moto.server import main
from moto.sqs import models


def _groups_in_flight(queue):
    return {
        message.group_id
        for message in queue._pending_messages
        if message.group_id is not None and not message.visible
    }


if not hasattr(models.Queue, "pending_message_groups"):
    sys.exit("moto changed: Queue.pending_message_groups is gone; revisit scripts/moto_server.py")
models.Queue.pending_message_groups = property(_groups_in_flight)

if __name__ == "__main__":
    sys.exit(main())
