"""The admin app's routes, a module per concern, each declaring its views with what the API document says of
them (admin/routing.py)."""

from proxy_addon.admin.routes import approvals, login, meta, receipts, review
from proxy_addon.admin.routing import Routes

ALL: tuple[Routes, ...] = (receipts.routes, approvals.routes, meta.routes, review.routes, login.routes)
