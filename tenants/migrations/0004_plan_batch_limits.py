from typing import Any

from django.core.validators import MinValueValidator
from django.db import migrations, models

# The seeded plans' batch limits, as they were kept in code by plan name. A plan
# an operator added had the free tier's, which are the fields' defaults.
BATCH_LIMITS = {
    "free": (100, 20_000),
    "pro": (1_000, 500_000),
    "enterprise": (5_000, 5_000_000),
}


def carry(apps: Any, schema_editor: Any) -> None:
    Plan = apps.get_model("tenants", "Plan")
    for name, (items, characters) in BATCH_LIMITS.items():
        Plan.objects.filter(name=name).update(
            batch_max_items=items, batch_max_characters=characters
        )


class Migration(migrations.Migration):
    dependencies = [
        ("tenants", "0003_longform_limits"),
    ]

    operations = [
        migrations.AddField(
            model_name="plan",
            name="batch_max_items",
            field=models.PositiveIntegerField(
                default=100, help_text="Items in one batch.", validators=[MinValueValidator(1)]
            ),
        ),
        migrations.AddField(
            model_name="plan",
            name="batch_max_characters",
            field=models.PositiveBigIntegerField(
                default=20000,
                help_text="Characters of all of a batch's items together.",
                validators=[MinValueValidator(1)],
            ),
        ),
        migrations.RunPython(carry, migrations.RunPython.noop),
    ]
