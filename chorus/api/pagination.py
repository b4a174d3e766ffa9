from rest_framework.pagination import LimitOffsetPagination


class Pagination(LimitOffsetPagination):
    """`?limit=&offset=`; bounded so no list call can ask for everything at once."""

    default_limit = 20
    max_limit = 100
