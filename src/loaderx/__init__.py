"""loaderx: feed ML training from local disk."""

from .arraystore import ArrayStore
from .converter import from_iterator, from_numpy
from .dataloader import DataLoader, LoaderError
from .dataset import DenseDataset, RaggedDataset, pad
from .packing import Packing
from .sampler import Sampler
from .streams import RaggedBatch
from .zrecord import (
    ChecksumError,
    CorruptStoreError,
    DestinationOverlapError,
    IndexOutOfRangeError,
    InvalidArgumentError,
    NoDictionaryError,
    StoreClosedError,
    StoreFullError,
    StoreLockedError,
    StoreReadOnlyError,
    StoreReplacedError,
    Zrecord,
    ZrecordError,
)

__version__ = "1.0.0.dev0"

__all__ = [
    "ArrayStore",
    "ChecksumError",
    "CorruptStoreError",
    "DataLoader",
    "DenseDataset",
    "DestinationOverlapError",
    "IndexOutOfRangeError",
    "InvalidArgumentError",
    "LoaderError",
    "NoDictionaryError",
    "Packing",
    "RaggedBatch",
    "RaggedDataset",
    "Sampler",
    "StoreClosedError",
    "StoreFullError",
    "StoreLockedError",
    "StoreReadOnlyError",
    "StoreReplacedError",
    "Zrecord",
    "ZrecordError",
    "__version__",
    "from_iterator",
    "from_numpy",
    "pad",
]
