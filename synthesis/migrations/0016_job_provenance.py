from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("synthesis", "0015_workerheartbeat_draining_since"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="provenance",
            field=models.CharField(blank=True, db_default="", default="", max_length=8),
        ),
    ]
