from django.db import models


class Invoice(models.Model):
    number = models.CharField(max_length=40)
    slot = models.DateTimeField()  # the scheduler slot that produced it
    token = models.BigIntegerField()  # the fencing token of that run
    pid = models.IntegerField()
