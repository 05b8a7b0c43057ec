"""loaderx: feed ML training from local disk."""

from ._cache import CacheBusyError, CacheHeadroomWarning, CacheTooSmallError
from ._remote import (
    RemoteChangedError,
    RemoteConfigError,
    RemoteError,
    RemoteIntegrityError,
    RemoteNetworkError,
    RemoteNotFoundError,
    RemotePermissionError,
)
from .arraystore import (
    ArrayStore,
    ArrayStoreBatchError,
    ArrayStoreFullError,
    ArrayStoreIOError,
    ArrayStoreReadOnlyError,
    CorruptPackError,
)
from .converter import from_iterator, from_numpy
from .dataloader import DataLoader, LoaderError
from .dataset import DenseDataset, RaggedDataset, pad
from .packing import Packing
from .processes import TransformProcessError
from .sampler import Sampler
from .schedule import ElasticError
from .shards import ManifestError
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
    StoreOSError,
    StoreReadOnlyError,
    StoreReplacedError,
    Zrecord,
    ZrecordError,
)

__version__ = "1.0.0.dev0"

__all__ = [
    "ArrayStore",
    "ArrayStoreBatchError",
    "ArrayStoreFullError",
    "ArrayStoreIOError",
    "ArrayStoreReadOnlyError",
    "CacheBusyError",
    "CacheHeadroomWarning",
    "CacheTooSmallError",
    "ChecksumError",
    "CorruptPackError",
    "CorruptStoreError",
    "DataLoader",
    "DenseDataset",
    "DestinationOverlapError",
    "ElasticError",
    "IndexOutOfRangeError",
    "InvalidArgumentError",
    "LoaderError",
    "ManifestError",
    "NoDictionaryError",
    "Packing",
    "RaggedBatch",
    "RaggedDataset",
    "RemoteChangedError",
    "RemoteConfigError",
    "RemoteError",
    "RemoteIntegrityError",
    "RemoteNetworkError",
    "RemoteNotFoundError",
    "RemotePermissionError",
    "Sampler",
    "StoreClosedError",
    "StoreFullError",
    "StoreLockedError",
    "StoreOSError",
    "StoreReadOnlyError",
    "StoreReplacedError",
    "TransformProcessError",
    "Zrecord",
    "ZrecordError",
    "__version__",
    "from_iterator",
    "from_numpy",
    "pad",
]
