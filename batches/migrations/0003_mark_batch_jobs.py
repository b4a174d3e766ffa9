"""Mark the jobs made for batch items before `Job.in_batch` existed."""

from django.db import migrations


def mark(apps, schema_editor):  # type: ignore[no-untyped-def]
    Job = apps.get_model("synthesis", "Job")
    Job.objects.filter(batch_item__isnull=False).update(in_batch=True)


class Migration(migrations.Migration):
    dependencies = [
        ("batches", "0002_batch_idempotency_key"),
        ("synthesis", "0014_job_in_batch"),
    ]

    operations = [migrations.RunPython(mark, migrations.RunPython.noop)]
