//! The endpoint's Block1 and de-duplication tables on `/metrics`.

use mintgate_coap::server::{Block1Stats, DedupSize, DedupStats};

use crate::exposition::Exposition;

/// The Block1 reassembly counters.
pub(super) fn collect_block1(st: &Block1Stats, held: usize, bytes: usize, m: &mut Exposition) {
    m.families(&[
            (
                "mintgate_block1_transfers",
                "Block1 transfers held (in progress, or completed and kept for Block2).",
                held as u64,
            ),
            (
                "mintgate_block1_bytes",
                "Bytes held by Block1 transfers.",
                bytes as u64,
            ),
            (
                "mintgate_block1_started_total",
                "Block1 transfers started.",
                st.started,
            ),
            (
                "mintgate_block1_completed_total",
                "Block1 requests handled whole.",
                st.completed,
            ),
            (
                "mintgate_block1_continue_total",
                "Blocks answered 2.31 Continue.",
                st.continued,
            ),
            (
                "mintgate_block1_incomplete_total",
                "Blocks answered 4.08 Request Entity Incomplete.",
                st.incomplete,
            ),
            (
                "mintgate_block1_too_large_total",
                "Blocks answered 4.13 Request Entity Too Large.",
                st.too_large,
            ),
            (
                "mintgate_block1_busy_total",
                "Blocks answered 5.03 (no room for another transfer).",
                st.busy,
            ),
            (
                "mintgate_block1_expired_total",
                "Block1 transfers dropped after the idle timeout.",
                st.expired,
            ),
            (
                "mintgate_block1_evicted_total",
                "Block1 transfers evicted for room (the sum of the three evicted_*_total).",
                st.evicted,
            ),
            (
                "mintgate_block1_busy_source_total",
                "5.03 answers: the source's own Block1 share was full.",
                st.busy_source,
            ),
            (
                "mintgate_block1_busy_global_total",
                "5.03 answers: the budget was full and the source was not lighter than the heaviest other.",
                st.busy_global,
            ),
            (
                "mintgate_block1_bad_total",
                "Blocks answered 4.00 (a block of the wrong size).",
                st.bad,
            ),
            (
                "mintgate_block1_evicted_own_total",
                "A source's own Block1 transfers evicted for its newer ones.",
                st.evicted_own,
            ),
            (
                "mintgate_block1_evicted_kept_total",
                "Completed Block1 bodies kept for Block2 evicted for room.",
                st.evicted_kept,
            ),
            (
                "mintgate_block1_evicted_heaviest_total",
                "Unfinished transfers of the heaviest source evicted for a lighter source's.",
                st.evicted_heaviest,
            ),
    ]);
}

/// The de-duplication tables' gauges and counters (summed over the
/// endpoint's shards).
pub(super) fn collect_dedup(z: &DedupSize, c: &DedupStats, m: &mut Exposition) {
    m.families(&[
        (
            "mintgate_dedup_entries",
            "Exchanges remembered for de-duplication.",
            z.entries as u64,
        ),
        (
            "mintgate_dedup_queued",
            "Slots of the de-duplication expiry queue, live and stale.",
            z.queued as u64,
        ),
        (
            "mintgate_dedup_bytes",
            "Bytes of responses cached for de-duplication.",
            z.bytes as u64,
        ),
        (
            "mintgate_dedup_evicted_early_total",
            "Exchanges forgotten before their lifetime: the table was full.",
            c.evicted_early,
        ),
        (
            "mintgate_dedup_evicted_bytes_total",
            "Exchanges forgotten before their lifetime: cached responses weighed too much.",
            c.evicted_bytes,
        ),
        (
            "mintgate_dedup_too_heavy_total",
            "Responses not cached: heavier alone than the byte budget.",
            c.too_heavy,
        ),
        (
            "mintgate_dedup_forgotten_total",
            "Exchanges forgotten on purpose (shed requests).",
            c.forgotten,
        ),
    ]);
}
