"""A deliberately broken dataloaderx plugin: it imports a dependency that is not installed.

``import dataloaderx`` must still work with it installed; using ``backend="broken"``
raises ``BackendUnavailableError`` naming this distribution and the import error.
"""

from __future__ import annotations

import dataloaderx_missing_dependency  # type: ignore[import-not-found]  # noqa: F401
