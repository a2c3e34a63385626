//! Drafting with a draft model: its prefill of joining prompts, its catch-up on the
//! tokens it lags behind the target by, its batched greedy drafts (under a row's
//! processors where it has some), and what its caches keep of a verified round.
use super::guide::{guide_rows, Guide};
use super::{drafts_on_device, roll_rejected, Drafts, SpecBatch};
use crate::batch::decode::cache_err;
use crate::batch::prefill::padded_forward;
use crate::batch::sequence::Sequence;
use crate::error::{EngineError, Result};
use crate::profile::SpecPhase;
use crate::step;
use mlx_array::{ops, transforms, Array, Dtype};
use mlx_cache::{BatchPromptCache, KvCache, PromptCache};
use mlx_models::LanguageModel;

impl SpecBatch {
    /// Brings the draft caches level with the target's (feeds the lagging tokens), so
    /// that new rows can join them; then prefills the new prompts (each but its last
    /// token) into draft caches: together, in right-padded chunks, as the target's
    /// prefill does, or one prompt at a time where right padding would leak into a
    /// draft's recurrent state. The drafts only propose tokens, so how their caches were
    /// batched changes no row's answer. Chunks of the batch's prefill step.
    pub(super) fn draft_prefill(
        &mut self,
        draft: &dyn LanguageModel,
        seqs: &[Sequence],
    ) -> Result<BatchPromptCache> {
        self.catch_up(draft)?;
        let step_size = self.prefill_step.max(1);
        let bodies: Vec<&[u32]> = seqs
            .iter()
            .map(|s| {
                let prompt = &s.job().req.prompt;
                &prompt[..prompt.len().saturating_sub(1)]
            })
            .collect();
        if draft.padded_prefill_is_exact() {
            let mut cache = empty_draft_rows(draft, seqs.len())?;
            feed_padded(draft, &mut cache, &bodies, step_size)?;
            return Ok(cache);
        }
        let mut own: Vec<PromptCache> = Vec::with_capacity(seqs.len());
        for body in bodies {
            let mut caches = fresh_draft_cache(draft)?;
            for chunk in body.chunks(step_size) {
                let a = Array::from_slice(chunk, &[1, chunk.len() as i32])?;
                drop(step::prefill(draft, &a, &mut caches, None)?);
            }
            own.push(caches);
        }
        let refs: Vec<&[Box<dyn KvCache>]> = own.iter().map(|c| c.as_slice()).collect();
        BatchPromptCache::merge(&refs).map_err(cache_err)
    }

    /// The most lagging tokens one catch-up forward feeds the draft model: all of them,
    /// or [`one_row_piece`] for a batch of one row.
    pub(super) fn catch_up_piece(&self) -> usize {
        if self.rows.len() == 1 {
            one_row_piece()
        } else {
            usize::MAX
        }
    }

    /// Whether the rows lag by different numbers of tokens (deferred prompts).
    fn lags_differ(&self) -> bool {
        let n = self.lag.first().map_or(0, Vec::len);
        self.lag.iter().any(|l| l.len() != n)
    }

    /// Feeds the draft model the tokens it lags behind the target by, in forwards of at
    /// most [`SpecBatch::catch_up_piece`] tokens; rows lagging by different numbers of
    /// tokens (prompts whose draft prefill was deferred) in right-padded chunks of the
    /// prefill step, as a batch's prompts are prefilled.
    pub(super) fn catch_up(&mut self, draft: &dyn LanguageModel) -> Result<()> {
        if self.lags_differ() {
            let lags: Vec<&[u32]> = self.lag.iter().map(Vec::as_slice).collect();
            feed_padded(
                draft,
                &mut self.draft_cache,
                &lags,
                self.prefill_step.max(1),
            )?;
            for l in &mut self.lag {
                l.clear();
            }
            return Ok(());
        }
        let n = self.lag.first().map_or(0, |l| l.len());
        let b = self.rows.len();
        if n == 0 || b == 0 {
            return Ok(());
        }
        let piece = self.catch_up_piece().min(n);
        for start in (0..n).step_by(piece) {
            let end = (start + piece).min(n);
            let flat: Vec<u32> = self
                .lag
                .iter()
                .flat_map(|l| l[start..end].iter().copied())
                .collect();
            let input = Array::from_slice(&flat, &[b as i32, (end - start) as i32])?;
            drop(step::prefill(
                draft,
                &input,
                self.draft_cache.layers_mut(),
                None,
            )?);
        }
        for l in &mut self.lag {
            l.clear();
        }
        Ok(())
    }

    /// Before a drafting step: where rows lag by different numbers of tokens, or where
    /// plain steps are timed and queued ([`SpecBatch::plain_model_steps`]) and the draft
    /// model lags by more than the one token a drafting round leaves it behind, feeds it
    /// the lagging tokens and waits for them. A `timed` step charges that time (from
    /// `started`) to the width model's catch-ups ([`Width::caught_up`]), so that the
    /// drafting step's own time, from the instant returned, is that of steady drafting.
    ///
    /// [`Width::caught_up`]: crate::batch::width::Width::caught_up
    pub(super) fn catch_up_timed(
        &mut self,
        draft: &dyn LanguageModel,
        started: std::time::Instant,
        timed: bool,
    ) -> Result<std::time::Instant> {
        let lagged = self.lag.iter().map(Vec::len).max().unwrap_or(0);
        if !self.lags_differ() && (!self.plain_model_steps || lagged <= 1) {
            return Ok(started);
        }
        self.catch_up(draft)?;
        if !timed {
            return Ok(started);
        }
        step::eval_state(self.draft_cache.layers())?;
        let secs = started.elapsed().as_secs_f64();
        let b = self.rows.len();
        if self
            .width_of(true, b)
            .is_some_and(|w| w.catch_up_stalled(b, lagged, secs))
        {
            tracing::debug!(
                "speculative: the draft model caught up on {lagged} token(s) of {b} row(s) in {:.1} ms, not timed (a stall)",
                secs * 1e3
            );
            return Ok(std::time::Instant::now());
        }
        tracing::debug!(
            "speculative: the draft model caught up on {lagged} token(s) of {b} row(s) in {:.1} ms",
            secs * 1e3
        );
        self.time_catch_up(lagged, b, secs);
        if let Some(w) = self.width_of(true, b) {
            w.caught_up(secs);
        }
        Ok(std::time::Instant::now())
    }

    /// `k` greedy drafts for every row from the draft model `[B][k]`; a row with
    /// logits processors drafts its first `caps[r]` under them (see [`Guide`]). Without
    /// such a row, under [`drafts_on_device`], they stay on the device.
    pub(super) fn draft_with_model(
        &mut self,
        draft: &dyn LanguageModel,
        k: usize,
        caps: &[usize],
    ) -> Result<Drafts> {
        let b = self.rows.len();
        if k == 0 {
            return Ok(Drafts::Host(vec![Vec::new(); b]));
        }
        // The first draft step feeds the lag and `y`: as many tokens a row, within one
        // catch-up piece.
        if self.lags_differ() || self.lag.first().map_or(0, Vec::len) >= self.catch_up_piece() {
            self.catch_up(draft)?;
        }
        let n = self.lag.first().map_or(0, |l| l.len()) + 1;
        let flat: Vec<u32> = self
            .lag
            .iter()
            .zip(&self.rows)
            .flat_map(|(l, r)| l.iter().copied().chain([r.y]))
            .collect();
        let mut input = Array::from_slice(&flat, &[b as i32, n as i32])?;
        let mut guides: Vec<Option<Guide>> = self
            .rows
            .iter_mut()
            .zip(caps)
            .map(|(r, &cap)| (cap > 0 && r.seq.has_processors()).then(|| Guide::new(r)))
            .collect();
        let guided = guides.iter().any(Option::is_some);
        let mut ys = Vec::with_capacity(k);
        let mut host: Vec<Vec<u32>> = vec![Vec::with_capacity(k); b];
        for j in 0..k {
            let logits = step::forward(draft, &input, self.draft_cache.layers_mut(), None)?;
            let logits = if guided {
                guide_rows(&mut guides, &logits, |r| j < caps[r])?
            } else {
                logits
            };
            let t = logits.argmax(Some(-1), false)?.astype(Dtype::Uint32)?;
            if guided {
                // The guides take each draft before the next is masked.
                let got = step::read_tokens(&t)?;
                for (r, g) in guides.iter_mut().enumerate() {
                    if let (Some(gd), Some(&tok)) = (g.as_mut(), got.get(r)) {
                        if j < caps[r] && !matches!(gd.take(tok), Ok(true)) {
                            *g = None;
                        }
                    }
                }
                for (h, tok) in host.iter_mut().zip(got) {
                    h.push(tok);
                }
            } else if self.profile_sync() {
                transforms::eval(&[&t])?;
                ys.push(t.clone());
            } else {
                transforms::async_eval(&[&t])?;
                ys.push(t.clone());
            }
            input = t.reshape(&[b as i32, 1])?;
        }
        for l in &mut self.lag {
            l.clear();
        }
        self.mark(SpecPhase::Draft);
        if guided {
            return Ok(Drafts::Host(host));
        }
        let refs: Vec<&Array> = ys.iter().collect();
        let all = ops::stack(&refs, 1)?;
        if drafts_on_device() {
            return Ok(Drafts::Device { tokens: all, k });
        }
        let flat = step::read_tokens(&all)?;
        self.mark(SpecPhase::DraftRead);
        Ok(Drafts::Host(flat.chunks(k).map(|c| c.to_vec()).collect()))
    }

    /// After a round of `k` model drafts, the draft caches keep what each row accepted
    /// (`keep[r]` drafts): of the round's tokens `y, drafts[r][..keep[r]]` (the target's
    /// history now) all but those the draft model was not fed. It was fed the `lagged`
    /// tokens, `y` and drafts `0..k-1`, so a row that accepted all `k` lags by its last
    /// draft; then every row lags by its last kept token, so that the next round's
    /// first draft step feeds as many tokens for every row. `fed`: the last drafts were
    /// fed too ([`SpecBatch::eager_feed`]), so every row keeps all it accepted and none
    /// lags. Each row's rejected positions are rolled in front of it and masked, as in
    /// the target caches.
    pub(super) fn keep_drafted(
        &mut self,
        keep: &[usize],
        drafts: &[Vec<u32>],
        k: usize,
        lagged: usize,
        fed: bool,
    ) -> Result<()> {
        if fed {
            // `y` and drafts `0..k`: k + 1 positions, of which a row keeps `y` and its
            // accepted drafts.
            let kept: Vec<usize> = keep.iter().map(|&a| a.min(k) + 1).collect();
            let most = kept.iter().copied().max().unwrap_or(0);
            mlx_cache::trim_prompt_cache(self.draft_cache.layers_mut(), (k + 1 - most) as i32);
            return roll_rejected(&mut self.draft_cache, &kept, most, lagged);
        }
        let lag = usize::from(keep.iter().any(|&a| a >= k));
        // Of the round's `k` fed positions (after the lagged ones), those each row keeps.
        let kept: Vec<usize> = keep.iter().map(|&a| (a + 1 - lag).min(k)).collect();
        let most = kept.iter().copied().max().unwrap_or(0);
        mlx_cache::trim_prompt_cache(self.draft_cache.layers_mut(), (k - most) as i32);
        roll_rejected(&mut self.draft_cache, &kept, most, lagged)?;
        if lag == 1 {
            for (r, l) in self.lag.iter_mut().enumerate() {
                let last = match keep[r] {
                    0 => self.rows[r].y,
                    a => drafts[r][a - 1],
                };
                l.push(last);
            }
        }
        Ok(())
    }
}

/// The most tokens a batch of one row feeds the draft model in one forward when it
/// catches up. The shim leaves one sequence's products of up to 32 rows to MLX
/// (`fast_rows`) and runs longer ones through our tiled 4-bit kernel; a draft model's
/// one-sequence catch-up on our multi-row kernel made every later draft step wait
/// ~230-300 ms on the H200 (GPU.md sessions 19 and 26). With plain steps queued (the
/// GPU's default since session 31) one stream's first catch-ups on a fresh machine
/// waited 14-35 s each and later processes did not (GPU.md session 31: most likely MLX
/// compiling kernels for the draft's new shapes once per machine).
pub(super) const ONE_ROW_PIECE: usize = 32;

/// [`ONE_ROW_PIECE`], or `MLX_DRAFT_CATCH_UP_PIECE=N` tokens (0: the whole lag in one
/// forward; an experiment). One row's catch-up on its deferred 128-token prompt took
/// 92-99 ms on a warm H100 in pieces of 32 (~1,350 tok/s), about what eight rows' 129
/// tokens each took in one padded forward (84-113 ms; GPU.md session 48), and the stall
/// the pieces were made for (session 31) was most likely MLX compiling the draft's
/// kernels on a fresh machine (session 43).
pub(super) fn one_row_piece() -> usize {
    static PIECE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *PIECE.get_or_init(|| {
        match std::env::var("MLX_DRAFT_CATCH_UP_PIECE").map(|v| v.trim().parse::<usize>()) {
            Ok(Ok(0)) => usize::MAX,
            Ok(Ok(n)) => n,
            Ok(Err(_)) => {
                tracing::warn!("MLX_DRAFT_CATCH_UP_PIECE is not a number of tokens: 32 stands");
                ONE_ROW_PIECE
            }
            Err(_) => ONE_ROW_PIECE,
        }
    })
}

/// Draft caches for `n` joining rows that hold nothing yet (their prompts deferred:
/// [`SpecBatch::deferred_draft_prefill`]).
pub(super) fn empty_draft_rows(draft: &dyn LanguageModel, n: usize) -> Result<BatchPromptCache> {
    let own = (0..n)
        .map(|_| fresh_draft_cache(draft))
        .collect::<Result<Vec<_>>>()?;
    let refs: Vec<&[Box<dyn KvCache>]> = own.iter().map(|c| c.as_slice()).collect();
    BatchPromptCache::merge(&refs).map_err(cache_err)
}

/// One sequence's empty caches of the draft model.
fn fresh_draft_cache(draft: &dyn LanguageModel) -> Result<PromptCache> {
    mlx_cache::make_prompt_cache(&draft.cache_specs(), None)
        .map_err(|e| EngineError::Unavailable(format!("cannot make a KV cache: {e}")))
}

/// Feeds each row of `cache` its `rows` tokens through the draft model, together in
/// right-padded chunks of `step_size` (a row whose tokens ran out gets an empty chunk).
fn feed_padded(
    draft: &dyn LanguageModel,
    cache: &mut BatchPromptCache,
    rows: &[&[u32]],
    step_size: usize,
) -> Result<()> {
    let mut done = 0;
    while rows.iter().any(|r| r.len() > done) {
        let chunks: Vec<&[u32]> = rows
            .iter()
            .map(|r| &r[done.min(r.len())..(done + step_size).min(r.len())])
            .collect();
        drop(padded_forward(draft, cache, &chunks)?);
        done += step_size;
    }
    Ok(())
}
