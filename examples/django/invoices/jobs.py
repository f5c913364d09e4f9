"""Jobs of the invoices app: `manage.py tenure_worker` finds this module and runs them, once per
slot however many workers run."""

import os

from django.db import transaction

from tenure.contrib.django import fence, outbox_enqueue, scheduler

from .models import Invoice


@scheduler.job("invoices.sync", every="1s", ttl="10s")
def sync_invoices(ctx):
    number = f"INV-{ctx.slot:%Y%m%d%H%M%S}"
    with transaction.atomic():
        Invoice.objects.create(number=number, slot=ctx.slot, token=ctx.token, pid=os.getpid())
        outbox_enqueue("invoices", number, {"number": number})
        # Last, so the row lock is held briefly: a worker that lost the job commits nothing.
        fence(ctx.job_key, ctx.token)
