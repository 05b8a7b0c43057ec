"""loaderx: feed ML training from local disk."""

from .arraystore import ArrayStore
from .converter import from_iterator, from_numpy
from .dataloader import DataLoader
from .dataset import DenseDataset, RaggedDataset, pad
from .packing import Packing
from .sampler import Sampler
from .streams import RaggedBatch
from .zrecord import Zrecord, ZrecordError

__version__ = "1.0.0.dev0"

__all__ = [
    "ArrayStore",
    "DataLoader",
    "DenseDataset",
    "Packing",
    "RaggedBatch",
    "RaggedDataset",
    "Sampler",
    "Zrecord",
    "ZrecordError",
    "__version__",
    "from_iterator",
    "from_numpy",
    "pad",
]
