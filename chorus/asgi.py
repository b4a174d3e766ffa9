import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chorus.settings")
django.setup(set_prefix=False)  # as django.core.asgi.get_asgi_application does

from chorus.asgi_handler import ChorusASGIHandler  # noqa: E402  (needs settings loaded)
from chorus.body_limit import BodyLimitMiddleware  # noqa: E402

django_application = ChorusASGIHandler()
application = BodyLimitMiddleware(django_application)
