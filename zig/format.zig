//! The on-disk format of a zrecord store: the superblock, the index entry, the
//! file names, and the checksums. Nothing here touches a file: every file
//! operation of the core goes through io.zig.
//!
//! A store is a directory:
//!
//!   superblock         two 4096-byte slots; each holds one `Superblock`
//!   lock               a writer holds flock(LOCK_EX) on it; its first page is
//!                      the shared page of in-place replaces (`JournalPage`)
//!   data-<id>          record payloads, back to back (append-only)
//!   index-<id>         `Entry` per record (indexed layout only)
//!   sums-<id>          one u64 checksum per full 16 KiB block of data (fixed layout only)
//!   dict-<id>          the trained zstd dictionary, if any
//!   journal-<id>       fixed layout: the redo journal of in-place replaces
//!                      (created by a durable store's first append, else
//!                      by its first in-place replace)
//!
//! `<id>` is the generation that created the file, as 16 hex digits. Files are
//! never rewritten in place except by appending past their committed length,
//! and by a fixed layout's same-length replace, which patches data and sums
//! only after its journal record is durable (journal.zig); every other
//! operation that changes existing bytes (delete, replace, compact) writes new
//! files and commits a superblock that names them.
//!
//! Two layouts:
//!   fixed    every record is raw and `record_bytes` long: record i lives at
//!            data offset i * record_bytes, with no per-record table entry.
//!            Checksums cover 16 KiB blocks of the data file (0.05% overhead);
//!            the partial last block's checksum sits in the superblock.
//!   indexed  records of any length and codec; entry i in the index file gives
//!            offset, lengths, codec and checksum of record i. The codec byte
//!            also carries the byte-shuffle filter and its element size (2, 4
//!            or 8), so records of one store may differ in both.
//! A store starts empty, becomes fixed if its first append is raw with equal
//! lengths, and turns indexed (once, by writing an index) when a later write
//! does not fit the fixed layout.
//!
//! Commit protocol (commit.zig, superblock.zig): payload bytes and index
//! entries are written past the committed lengths (or into new files),
//! fsync'ed, then the superblock of generation g+1 is written into slot
//! (g+1) % 2 and fsync'ed before the operation returns. A torn or damaged
//! slot fails its checksum and the other slot (generation g, durable) wins,
//! so every operation happens whole or not at all. Files a commit replaced
//! are unlinked only after the new superblock is fsync'ed.
//!
//! Everything is little-endian; the library refuses to build for big-endian
//! hosts rather than silently misreading a store.
const std = @import("std");
const builtin = @import("builtin");
const assert = std.debug.assert;

comptime {
    if (builtin.cpu.arch.endian() != .little) {
        @compileError(
            "zrecord stores are little-endian on disk; big-endian hosts are not supported",
        );
    }
}

pub const magic = "ZRECORD\x00".*;
pub const version: u32 = 1;

pub const slot_bytes: u64 = 4096;
pub const superblock_file_bytes: u64 = 2 * slot_bytes;
pub const block_bytes: u64 = 16 * 1024;

/// Far past the 0.9 line's 1 MiB records and 2^24 records.
pub const record_bytes_max: u64 = 1 << 48;
pub const record_count_max: u64 = 1 << 48;
/// A trained dictionary is at most this large; bounds the allocation on open.
pub const dict_bytes_max: u64 = 16 << 20;
/// zstd cannot make a useful dictionary smaller than this.
pub const dict_bytes_min: u64 = 256;

pub const zstd_level: c_int = 3;
pub const zstd_block_bytes_max: u64 = 128 * 1024;
pub const zstd_expansion_max: u64 = zstd_block_bytes_max / 4;

/// The codec byte of an index entry. The low nibble is the coder (raw, zstd,
/// zstd with the store's dictionary, LZ4); the high nibble, when not 0, says
/// the record was byte-shuffled by 2^nibble-byte elements before compression
/// (shuffle.zig). The payload is a standard zstd frame, or LZ4 frame, either
/// way: any zstd or lz4 tool decodes it to the (shuffled) bytes. New codecs
/// are appended: the ids are on disk and the declaration order is the
/// codec table Python reads (lx_codec_get).
pub const Codec = enum(u8) {
    raw = 0x00,
    zstd = 0x01,
    zstd_dict = 0x02,
    zstd_shuffle2 = 0x11,
    zstd_shuffle4 = 0x21,
    zstd_shuffle8 = 0x31,
    zstd_dict_shuffle2 = 0x12,
    zstd_dict_shuffle4 = 0x22,
    zstd_dict_shuffle8 = 0x32,
    lz4 = 0x03,
    lz4_shuffle2 = 0x13,
    lz4_shuffle4 = 0x23,
    lz4_shuffle8 = 0x33,

    pub const Coder = enum(u4) { raw = 0, zstd = 1, zstd_dict = 2, lz4 = 3 };

    pub fn from(value: u64) ?Codec {
        return std.enums.fromInt(Codec, value);
    }

    /// The element size the record was shuffled by; 1 when it was not.
    pub fn elementBytes(codec: Codec) u8 {
        return @as(u8, 1) << @intCast(@intFromEnum(codec) >> 4);
    }

    pub fn usesDictionary(codec: Codec) bool {
        return codec.coder() == .zstd_dict;
    }

    /// What compressed the (shuffled) record: the low nibble.
    pub fn coder(codec: Codec) Coder {
        return @enumFromInt(@intFromEnum(codec) & 0x0f);
    }
};

comptime {
    for (std.enums.values(Codec)) |codec| {
        assert(codec.elementBytes() == 1 or (codec != .raw and codec.elementBytes() <= 8));
        _ = std.enums.fromInt(Codec.Coder, @intFromEnum(codec) & 0x0f).?;
    }
}

pub const Layout = enum(u32) {
    empty = 0,
    fixed = 1,
    indexed = 2,
};

pub const Superblock = extern struct {
    magic: [8]u8,
    version: u32,
    layout: u32,
    generation: u64,
    record_count: u64,
    /// Fixed layout: bytes of every record. Otherwise 0.
    record_bytes: u64,
    data_file: u64,
    data_bytes: u64,
    /// Indexed layout: the index file; it holds record_count entries.
    index_file: u64,
    /// Fixed layout: the block checksum file; it holds data_bytes / block_bytes sums.
    sums_file: u64,
    /// Fixed layout: checksum of the partial last block (0 if there is none).
    tail_checksum: u64,
    /// Stored bytes of live records; data_bytes - live_bytes is reclaimable.
    live_bytes: u64,
    dict_file: u64,
    dict_bytes: u64,
    dict_checksum: u64,
    reserved: [13]u64,
    /// Fixed layout: the journal of in-place replaces (journal.zig), or 0.
    journal_file: u64,
    /// Journal records up to this sequence are in the data and sums files
    /// this superblock names (a checkpoint); later ones are replayed on open.
    journal_sequence: u64,
    /// durable=False: 1 when this superblock was written without a sync,
    /// 0 when it was made durable.
    unsynced: u64,
    /// When unsynced: the generation of the last synced state, which the
    /// other slot holds. Open checks what changed since then.
    synced_base: u64,
    checksum: u64,

    pub fn empty() Superblock {
        var superblock = std.mem.zeroes(Superblock);
        superblock.magic = magic;
        superblock.version = version;
        superblock.layout = @intFromEnum(Layout.empty);
        return superblock;
    }

    pub fn computeChecksum(superblock: *const Superblock) u64 {
        const bytes = std.mem.asBytes(superblock);
        return hash(0x5355_5045_5242_4c4b, bytes[0 .. bytes.len - @sizeOf(u64)]);
    }

    pub fn seal(superblock: *Superblock) void {
        superblock.checksum = superblock.computeChecksum();
    }

    pub fn getLayout(superblock: *const Superblock) Layout {
        return @enumFromInt(superblock.layout);
    }

    /// Why a slot cannot be used, or null when it is internally consistent.
    /// Called on every slot read from disk, before any field is trusted.
    pub fn invalidReason(superblock: *const Superblock) ?[]const u8 {
        if (!std.mem.eql(u8, &superblock.magic, &magic)) return "wrong magic";
        if (superblock.checksum != superblock.computeChecksum()) return "checksum mismatch";
        if (superblock.version != version) return "unsupported version";
        if (superblock.layout > @intFromEnum(Layout.indexed)) return "unknown layout";
        if (superblock.record_count > record_count_max) return "record count out of range";
        if (superblock.live_bytes > superblock.data_bytes) return "live bytes exceed data bytes";
        if (superblock.dict_bytes > dict_bytes_max) return "dictionary too large";
        if ((superblock.dict_file == 0) != (superblock.dict_bytes == 0))
            return "dictionary fields disagree";
        if (superblock.unsynced > 1) return "unknown sync state";
        if (superblock.unsynced == 1 and superblock.synced_base >= superblock.generation)
            return "synced " ++
                "base is not older than the superblock";
        if (superblock.unsynced == 0 and superblock.synced_base != 0) return "synced superblock " ++
            "with a synced base";
        switch (superblock.getLayout()) {
            .empty => {
                if (superblock.record_count != 0 or superblock.data_bytes != 0)
                    return "empty layout holds data";
            },
            .fixed => {
                if (superblock.record_bytes > record_bytes_max) return "record length out of range";
                const total = std.math.mul(
                    u64,
                    superblock.record_count,
                    superblock.record_bytes,
                ) catch
                    return "fixed layout size overflows";
                if (total != superblock.data_bytes) return "fixed layout size disagrees with " ++
                    "data length";
                if (superblock.data_file == 0 or superblock.sums_file == 0)
                    return "fixed layout without files";
                if (superblock.live_bytes != superblock.data_bytes)
                    return "fixed layout with garbage";
            },
            .indexed => {
                if (superblock.record_bytes != 0) return "indexed layout with record length";
                if (superblock.data_file == 0 or superblock.index_file == 0)
                    return "indexed layout without files";
            },
        }
        return null;
    }
};

comptime {
    assert(@sizeOf(Superblock) == 256);
    assert(@sizeOf(Superblock) <= slot_bytes);
}

/// One record of an indexed store. `stored_codec` packs the stored length
/// (low 56 bits) and the codec (high 8 bits).
pub const Entry = extern struct {
    offset: u64,
    raw_bytes: u64,
    stored_codec: u64,
    checksum: u64,

    pub fn init(
        offset: u64,
        raw_bytes: u64,
        stored_bytes: u64,
        record_codec: Codec,
        payload: []const u8,
    ) Entry {
        assert(stored_bytes < (1 << 56));
        assert(payload.len == stored_bytes);
        var entry = Entry{
            .offset = offset,
            .raw_bytes = raw_bytes,
            .stored_codec = stored_bytes | (@as(u64, @intFromEnum(record_codec)) << 56),
            .checksum = 0,
        };
        entry.checksum = entry.payloadChecksum(payload);
        return entry;
    }

    pub fn storedBytes(entry: Entry) u64 {
        return entry.stored_codec & ((1 << 56) - 1);
    }

    pub fn codec(entry: Entry) ?Codec {
        return Codec.from(entry.stored_codec >> 56);
    }

    /// Covers the payload and the entry's own lengths and codec (not the
    /// offset, so compaction moves payloads without rehashing). A flipped
    /// offset points at other bytes and fails the payload check.
    pub fn payloadChecksum(entry: Entry, payload: []const u8) u64 {
        const seed = entry.raw_bytes *% 0x9E37_79B9_7F4A_7C15 ^ entry.stored_codec;
        return hash(seed, payload);
    }

    /// Why the entry cannot be used against a data file of `data_bytes`, or null.
    pub fn invalidReason(entry: Entry, data_bytes: u64) ?[]const u8 {
        const codec_value = entry.codec() orelse return "unknown codec in index entry";
        const stored = entry.storedBytes();
        if (entry.raw_bytes > record_bytes_max) return "record length out of range";
        if (codec_value == .raw and stored != entry.raw_bytes) return "raw record with stored " ++
            "length != length";
        // A zstd block of 4 bytes (an RLE block) expands to at most 128 KiB,
        // so no frame decodes to more than this (an LZ4 frame expands far
        // less: at most ~255x per block): a damaged length cannot make a
        // reader allocate without bound.
        const frame_bytes_max = stored *| zstd_expansion_max +| zstd_block_bytes_max;
        if (codec_value != .raw and entry.raw_bytes > frame_bytes_max) {
            return "compressed record claims more bytes than its frame can hold";
        }
        const end = std.math.add(u64, entry.offset, stored) catch return "record offset overflows";
        if (end > data_bytes) return "record lies past the end of the data file";
        return null;
    }
};

comptime {
    assert(@sizeOf(Entry) == 32);
}

/// The shared page: the first page of the `lock` file, mapped by the writer
/// and every reader of a store that has a journal. Not a commit and never
/// synced: nothing in it is trusted after a crash until a writer or a
/// settling reader rewrote it. The journal file starts with a page of the
/// same layout, of which only the magic and version are used.
pub const JournalPage = extern struct {
    magic: [8]u8,
    version: u32,
    reserved0: u32,
    /// Sequence lock: odd while a writer changes committed bytes in place.
    sequence_lock: u64,
    /// The checksum of the data file's partial last block while generation
    /// `tail_generation` is current (in-place replaces change it without a
    /// new superblock).
    tail_generation: u64,
    tail_checksum: u64,
    /// The newest generation a writer made durable (its slot synced), and
    /// `syncedCheck` of it. Set only after that sync, so whatever of it
    /// reaches the disk never names a generation that is not durable: a
    /// store that opens older than it lost a synced commit (a damaged
    /// slot), not a torn one (store.zig). Absent (0, 0) in older stores.
    synced_generation: u64,
    synced_check: u64,
    reserved: [1]u64,
};

/// Binds `JournalPage.synced_generation` to its check: a damaged or
/// half-written pair names no generation.
pub fn syncedCheck(generation: u64) u64 {
    return hash(0x5359_4e43_4544_4745, std.mem.asBytes(&generation)) | 1;
}

pub const journal_magic = "ZJOURNAL".*;
/// Version 2: records start right after the 64-byte header, inside the
/// file's first 4 KiB page, so a small replace overwrites bytes the journal
/// already holds and its fdatasync writes no new file length (0.35 ms
/// against 0.86 ms for one that grows the file, here). Version 1 (records
/// after the whole page) is still read and written.
pub const journal_version: u32 = 2;
/// A journal file is at least this long: its first page, created whole.
pub const journal_page_bytes: u64 = 4096;

/// Where the records of a journal of version `journal_file_version` start.
pub fn journalRecordsStart(journal_file_version: u32) u64 {
    return if (journal_file_version == 1) journal_page_bytes else @sizeOf(JournalPage);
}

/// One journaled replace. Followed by `row_count` row indices (ascending),
/// `block_count` block numbers (ascending) and their new checksums, the
/// `row_count * row_bytes` new rows, and zero padding to 8 bytes. The
/// checksum covers the header up to it and the body.
pub const JournalRecord = extern struct {
    magic: [8]u8,
    sequence: u64,
    base_generation: u64,
    /// Header, body and padding: where the next record starts.
    total_bytes: u64,
    row_bytes: u64,
    row_count: u64,
    block_count: u64,
    /// The partial last block's checksum after this replace (0 if none).
    tail_checksum: u64,
    checksum: u64,

    pub fn bodyBytes(record: *const JournalRecord) ?u64 {
        const rows = std.math.mul(u64, record.row_count, record.row_bytes) catch return null;
        const lists = std.math.mul(
            u64,
            record.row_count +| 2 *| record.block_count,
            8,
        ) catch return null;
        return std.math.add(u64, rows, lists) catch null;
    }

    pub fn computeChecksum(record: *const JournalRecord, body: []const u8) u64 {
        var hasher = record.checksumStart();
        hasher.update(body);
        return hasher.final();
    }

    /// The checksum's state after the header: the body follows in pieces.
    pub fn checksumStart(record: *const JournalRecord) std.hash.XxHash3 {
        var hasher = std.hash.XxHash3.init(0x4a4f_5552_4e41_4c21);
        hasher.update(std.mem.asBytes(record)[0 .. @sizeOf(JournalRecord) - 8]);
        return hasher;
    }
};

comptime {
    assert(@sizeOf(JournalPage) == 64);
    assert(@sizeOf(JournalRecord) == 72);
    assert(journal_page_bytes >= @sizeOf(JournalPage));
}

pub fn hash(seed: u64, bytes: []const u8) u64 {
    return std.hash.XxHash3.hash(seed, bytes);
}

/// Checksum of block `block` of a fixed store's data file. The seed binds the
/// checksum to its block number, so swapped blocks do not verify.
pub fn blockChecksum(block: u64, bytes: []const u8) u64 {
    assert(bytes.len <= block_bytes);
    return hash(block *% 0xC2B2_AE3D_27D4_EB4F +% bytes.len, bytes);
}

pub const FileKind = enum { data, index, sums, dict, journal };

pub const file_name_bytes = 32;

pub fn fileName(buffer: *[file_name_bytes]u8, kind: FileKind, id: u64) [:0]const u8 {
    assert(id != 0);
    return std.fmt.bufPrintZ(buffer, "{s}-{x:0>16}", .{ @tagName(kind), id }) catch unreachable;
}

/// Parses a store file name back into its kind and id; null for other names.
pub fn parseFileName(name: []const u8) ?struct { kind: FileKind, id: u64 } {
    inline for (@typeInfo(FileKind).@"enum".fields) |field| {
        const prefix = field.name ++ "-";
        if (name.len == prefix.len + 16 and std.mem.startsWith(u8, name, prefix)) {
            const id = std.fmt.parseInt(u64, name[prefix.len..], 16) catch return null;
            return .{ .kind = @field(FileKind, field.name), .id = id };
        }
    }
    return null;
}

test "superblock seal and validation catch every flipped bit of a sealed slot" {
    var superblock = Superblock.empty();
    superblock.seal();
    try std.testing.expect(superblock.invalidReason() == null);
    const bytes = std.mem.asBytes(&superblock);
    for (0..bytes.len * 8) |bit| {
        var copy = superblock;
        std.mem.asBytes(&copy)[bit / 8] ^= @as(u8, 1) << @intCast(bit % 8);
        try std.testing.expect(copy.invalidReason() != null);
    }
}

test "fixed layout validation rejects sizes that disagree or overflow" {
    var superblock = Superblock.empty();
    superblock.layout = @intFromEnum(Layout.fixed);
    superblock.record_count = 3;
    superblock.record_bytes = 4;
    superblock.data_bytes = 12;
    superblock.live_bytes = 12;
    superblock.data_file = 2;
    superblock.sums_file = 2;
    superblock.seal();
    try std.testing.expect(superblock.invalidReason() == null);
    superblock.record_bytes = 1 << 47;
    superblock.record_count = 1 << 20;
    superblock.seal();
    try std.testing.expect(superblock.invalidReason() != null);
}

test "entry packs codec and stored length and checks its payload" {
    const payload = "hello";
    const entry = Entry.init(10, 7, payload.len, .zstd, payload);
    try std.testing.expectEqual(@as(u64, 5), entry.storedBytes());
    try std.testing.expectEqual(Codec.zstd, entry.codec().?);
    try std.testing.expectEqual(entry.checksum, entry.payloadChecksum(payload));
    try std.testing.expect(entry.checksum != entry.payloadChecksum("hellp"));
    try std.testing.expect(entry.invalidReason(15) == null);
    try std.testing.expect(entry.invalidReason(14) != null);
    var wild = entry;
    wild.offset = std.math.maxInt(u64) - 1;
    try std.testing.expect(wild.invalidReason(std.math.maxInt(u64)) != null);
}

test "file names round trip and foreign names are ignored" {
    var buffer: [file_name_bytes]u8 = undefined;
    const name = fileName(&buffer, .index, 0x2a);
    try std.testing.expectEqualStrings("index-000000000000002a", name);
    const parsed = parseFileName(name).?;
    try std.testing.expectEqual(FileKind.index, parsed.kind);
    try std.testing.expectEqual(@as(u64, 0x2a), parsed.id);
    try std.testing.expect(parseFileName("schema.msgpack") == null);
    try std.testing.expect(parseFileName("data-zz00000000000000") == null);
}
