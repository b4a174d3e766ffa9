import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chorus.settings")
django.setup(set_prefix=False)  # as django.core.asgi.get_asgi_application does

from chorus.asgi_handler import ChorusASGIHandler, in_own_context  # noqa: E402  (settings first)
from chorus.gc_tuning import tune_for_requests  # noqa: E402
from chorus.warm_up import web_warm_up  # noqa: E402
from quotas.middleware import BodyLimitMiddleware  # noqa: E402

django_application = ChorusASGIHandler()
application = in_own_context(BodyLimitMiddleware(django_application))
web_warm_up()  # the first request waits no longer than the next ones
tune_for_requests()  # last: the application and what it loaded are in place
