"""Endpoint secrets sealed at rest (chorus.sealing) instead of kept in the clear."""

from django.db import migrations, models


def seal_secrets(apps, schema_editor):
    from chorus.sealing import seal

    endpoints = apps.get_model("webhooks", "WebhookEndpoint")
    for endpoint in endpoints.objects.only("pk", "secret").iterator():
        endpoints.objects.filter(pk=endpoint.pk).update(secret_sealed=seal(endpoint.secret))


def unseal_secrets(apps, schema_editor):
    from chorus.sealing import unseal

    endpoints = apps.get_model("webhooks", "WebhookEndpoint")
    for endpoint in endpoints.objects.only("pk", "secret_sealed").iterator():
        endpoints.objects.filter(pk=endpoint.pk).update(secret=unseal(endpoint.secret_sealed))


class Migration(migrations.Migration):
    dependencies = [("webhooks", "0001_initial")]

    operations = [
        migrations.AddField(
            model_name="webhookendpoint",
            name="secret_sealed",
            field=models.TextField(default=""),
            preserve_default=False,
        ),
        # A default, so that reversing the removal below can add the column back
        # to a table that has rows (unseal_secrets then fills it).
        migrations.AlterField(
            model_name="webhookendpoint",
            name="secret",
            field=models.CharField(max_length=100, default=""),
        ),
        migrations.RunPython(seal_secrets, unseal_secrets),
        migrations.RemoveField(model_name="webhookendpoint", name="secret"),
    ]
