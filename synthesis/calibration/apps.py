from django.apps import AppConfig


class CalibrationConfig(AppConfig):
    name = "synthesis.calibration"
    label = "calibration"
    verbose_name = "Device calibration"
    default_auto_field = "django.db.models.BigAutoField"
