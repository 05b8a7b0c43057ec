/* The C ABI of libloaderx, the single source of truth for the cffi cdef.
 * zig/root.zig implements exactly these functions; tests/test_native.py checks
 * the sizes of the structs against the library. Every call that can fail
 * returns a status code (LX_OK = 0); the message of the last failure on the
 * calling thread is read with lx_error_message. */

uint32_t lx_version(void);
size_t lx_error_message(char *target, size_t capacity);
/* The errno of the OS failure behind the last failure (0: none). */
int32_t lx_error_errno(void);

/* ---- zrecord ---------------------------------------------------------- */

typedef struct lx_store lx_store;

typedef struct {
    uint64_t records;        /* live records, indices 0..records */
    uint64_t live_bytes;     /* stored (compressed) bytes of live records */
    uint64_t chunk_bytes;    /* bytes of the data file */
    uint64_t reclaimable;    /* chunk_bytes - live_bytes: what compact() frees */
    uint64_t record_bytes;   /* fixed layout: bytes per record; else 0 */
    uint64_t generation;     /* commit counter */
    uint32_t layout;         /* 0 empty, 1 fixed, 2 indexed */
    uint32_t has_dict;
    uint32_t fell_back;      /* 1: open fell back past a superblock slot that does not decode */
    uint32_t damaged;        /* 1: that slot is damaged, not torn: verify fails, writes are refused */
    uint64_t data_file;      /* the id in the data file's name (data-%016x), 0: none */
} lx_store_info;

uint64_t lx_store_info_bytes(void);

/* The core's limits, defined once in Zig. */
typedef struct {
    uint64_t record_bytes_max;
    uint64_t record_count_max;
    uint64_t dict_bytes_min;
    uint64_t dict_bytes_max;
    uint64_t sampler_length_max;
    uint64_t sampler_groups_max;
} lx_limits_t;

void lx_limits(lx_limits_t *out);
/* The flags of lx_store_open (zig/root.zig). */
#define LX_OPEN_VERIFY_ALL 1       /* check every read against its checksum */
#define LX_OPEN_DEFER_SYNC 2       /* durable=False: fsyncs wait for sync() and close() */
#define LX_OPEN_STAGED 4           /* a new store is not durable until sync() */
#define LX_OPEN_EXISTING 8         /* open an existing store only: create nothing */
#define LX_OPEN_VERIFY_INDEXED 16  /* check the reads of the indexed layout */

int lx_store_open(const char *path, uint32_t threads, uint32_t flags, lx_store **out);
/* lx_store_open of an existing store that first reads the directory's file
   side_name (a dataset's schema) into side, through the directory handle the
   store opens by, and gives that directory's (device, inode) in identity and
   the store's lx_store_info_get in info. *side_bytes: the bytes read (up to
   side_capacity); UINT64_MAX, and *out NULL, where the directory has no such
   file. */
int lx_store_open_beside(const char *path, uint32_t threads, uint32_t flags,
                         const char *side_name, uint8_t *side, size_t side_capacity,
                         uint64_t *side_bytes, uint64_t identity[2], lx_store_info *info,
                         lx_store **out);
void lx_store_close(lx_store *store);
int lx_store_refresh(lx_store *store);
uint64_t lx_store_count(lx_store *store);
int lx_store_info_get(lx_store *store, lx_store_info *out);
/* Why open fell back or found damage (empty if neither), as lx_error_message. */
size_t lx_store_fall_back_reason(lx_store *store, char *target, size_t capacity);
int lx_store_append(lx_store *store, const uint8_t *source, uint64_t source_bytes,
                    const uint64_t *offsets, uint64_t count, uint32_t codec,
                    uint64_t *first_out);
int lx_store_gather(lx_store *store, const uint64_t *indices, uint64_t count,
                    uint8_t *target, uint64_t target_bytes,
                    const uint64_t *target_offsets /* NULL: k * length */);
/* The ragged gather: records packed from the start of target, their row
 * offsets (count + 1, rows of row_bytes) in offsets_out, the bytes the batch
 * needs in needed_bytes_out; if that is more than target_bytes nothing was
 * read (offsets_out then holds byte offsets): retry with a larger target. */
int lx_store_gather_rows(lx_store *store, const uint64_t *indices, uint64_t count,
                         uint64_t row_bytes, uint8_t *target, uint64_t target_bytes,
                         uint64_t *offsets_out, uint64_t *needed_bytes_out);
int lx_store_lengths(lx_store *store, const uint64_t *indices, uint64_t count,
                     uint64_t *out);
int lx_store_delete(lx_store *store, const uint64_t *indices, uint64_t count,
                    uint32_t keep_order);
int lx_store_replace(lx_store *store, const uint64_t *indices, uint64_t count,
                     const uint8_t *source, uint64_t source_bytes,
                     const uint64_t *offsets, uint32_t codec);
int lx_store_compact(lx_store *store);
int lx_store_sync(lx_store *store);
int lx_store_train_dict(lx_store *store, const uint8_t *samples,
                        const uint64_t *sizes, uint64_t count,
                        uint64_t target_bytes, uint64_t *dict_bytes_out);
int lx_store_verify(lx_store *store, uint64_t start, uint64_t end,
                    uint64_t *damaged_out, uint64_t *damaged_count_out);
/* Stored bytes of a batch encoded with `codec` (no dictionary), nothing written. */
int lx_encoded_bytes(const uint8_t *source, uint64_t source_bytes,
                     const uint64_t *offsets, uint64_t count, uint32_t codec,
                     uint32_t threads, uint64_t *stored_bytes_out);

/* ---- codecs (zig/format.zig) ----------------------------------------- */

/* How many codecs there are; lx_codec_get(index) for 0 <= index < count
 * gives one's name (NUL-terminated, cut to capacity), id, shuffle element
 * bytes (1: not shuffled) and whether it uses the store's dictionary. */
uint32_t lx_codec_count(void);
int lx_codec_get(uint32_t index, char *name, size_t capacity, uint32_t *id_out,
                 uint32_t *element_bytes_out, uint32_t *uses_dictionary_out);
/* `bytes` of source byte-shuffled by element_bytes (2, 4, 8) into target. */
int lx_codec_shuffle(const uint8_t *source, uint64_t bytes, uint32_t element_bytes,
                     uint8_t *target);

/* One buffer (not a store record) with a codec that uses no dictionary:
 * lx_codec_bound gives the most bytes lx_codec_encode writes for
 * source_bytes; lx_codec_encode writes the frame a record of that codec
 * stores into target (capacity at least the bound), its length into
 * written_out; lx_codec_decode decodes such a frame into exactly
 * target_bytes (corrupt if it is not one). Pack files use them. */
int lx_codec_bound(uint32_t codec, uint64_t source_bytes, uint64_t *bound_out);
int lx_codec_encode(uint32_t codec, const uint8_t *source, uint64_t source_bytes,
                    uint8_t *target, uint64_t capacity, uint64_t *written_out);
int lx_codec_decode(uint32_t codec, const uint8_t *payload, uint64_t payload_bytes,
                    uint8_t *target, uint64_t target_bytes);

/* ---- writable_batch_mode (zig/changes.zig) ------------------------------ */

/* The rows (ascending, each once) of `edited` whose bytes differ from
 * `original`'s (both rows * row_bytes bytes), among the rows overlapping
 * `pages` (ascending numbers of page_bytes pages): into rows_out (room for
 * capacity rows, at least min(rows, page_count * (page_bytes / row_bytes +
 * 2))), their count into count_out. */
int lx_changed_rows(const uint8_t *edited, const uint8_t *original, uint64_t rows,
                    uint64_t row_bytes, const uint64_t *pages, uint64_t page_count,
                    uint64_t page_bytes, uint64_t *rows_out, uint64_t capacity,
                    uint64_t *count_out);

/* lx_changed_rows against the committed records of a fixed store (record i
 * at i * record bytes): `edited` holds edited_bytes of records 0.. of it. */
int lx_store_changed_rows(lx_store *store, const uint8_t *edited, uint64_t edited_bytes,
                          const uint64_t *pages, uint64_t page_count, uint64_t page_bytes,
                          uint64_t *rows_out, uint64_t capacity, uint64_t *count_out);

/* ---- zsampler --------------------------------------------------------- */

/* Every batch is a pure function of (config, step); see zig/sampler.zig. */
typedef struct {
    uint64_t length;       /* index space 0..length, 1 <= length <= 2^63 */
    uint64_t batch_size;   /* this rank's share of the global batch */
    uint64_t seed;
    uint64_t rank;         /* 0 <= rank < world_size */
    uint64_t world_size;   /* global batch = batch_size * world_size */
    uint32_t mode;         /* 0 SEQUENTIAL, 1 IID, 2 CYCLIC, 3 BLOCK (lx_sampler_block_batch) */
    uint32_t reserved;     /* 0 */
} lx_sampler_config;

uint64_t lx_sampler_config_bytes(void);
int lx_sampler_batch(const lx_sampler_config *config, uint64_t step,
                     uint64_t *target, uint64_t target_count);

/* BLOCK mode's groups: group g holds indices starts[g]..starts[g + 1]
 * (group_count + 1 entries, from 0, strictly increasing, to length). */
typedef struct {
    const uint64_t *starts;
    uint64_t group_count;   /* 1..sampler_groups_max */
    uint64_t per_block;     /* groups per block, >= 1 */
    uint64_t *scratch;      /* 2 * group_count + 1 slots, one buffer per concurrent call */
    uint64_t scratch_count;
} lx_sampler_blocks;

uint64_t lx_sampler_blocks_bytes(void);
int lx_sampler_block_batch(const lx_sampler_config *config, const lx_sampler_blocks *blocks,
                           uint64_t step, uint64_t *target, uint64_t target_count);
/* Positions offset..offset + count of BLOCK cycle `cycle`'s stream. */
int lx_sampler_block_positions(const lx_sampler_config *config, const lx_sampler_blocks *blocks,
                               uint64_t cycle, uint64_t offset, uint64_t *target, uint64_t count);

/* ---- sharded datasets (zig/shards.zig) -------------------------------- */

/* Borrows `shard_count` open stores; shard s holds global rows
 * row_starts[s]..row_starts[s + 1] (shard_count + 1 entries). */
typedef struct lx_shards lx_shards;

/* The most shards one handle reads: the one definition of the bound. */
uint64_t lx_shard_count_max(void);
int lx_shards_open(lx_store *const *stores, const uint64_t *row_starts,
                   uint64_t shard_count, uint32_t threads, lx_shards **out);
void lx_shards_close(lx_shards *shards);
int lx_shards_gather(lx_shards *shards, const uint64_t *indices, uint64_t count,
                     uint8_t *target, uint64_t target_bytes,
                     const uint64_t *target_offsets /* NULL: k * record_bytes */,
                     uint64_t record_bytes);
int lx_shards_gather_rows(lx_shards *shards, const uint64_t *indices, uint64_t count,
                          uint64_t row_bytes, uint8_t *target, uint64_t target_bytes,
                          uint64_t *offsets_out, uint64_t *needed_bytes_out);
int lx_shards_lengths(lx_shards *shards, const uint64_t *indices, uint64_t count,
                      uint64_t *out);
