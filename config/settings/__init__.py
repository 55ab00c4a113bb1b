"""Settings, split by concern; import order matters only for DEBUG/secret checks."""

from .api import *  # noqa: F403
from .core import *  # noqa: F403
from .database import *  # noqa: F403
from .observability import *  # noqa: F403
from .scheduling import *  # noqa: F403
from .security import *  # noqa: F403
from .tasks import *  # noqa: F403
