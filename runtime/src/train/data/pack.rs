//! Several instances to a row (`--pack`): a task's rows are mostly padding
//! (an instance of size `n` among sizes up to the training size fills its
//! row's front), so a batch of `B` instances laid `k` to a row in `B / k`
//! rows spends far fewer positions on `PAD`. Each instance keeps its own
//! predictions; a reset at its first token drops the state the ones before
//! it left ([`crate::mamba3::cpu::HeadInputs::resets`]), so it computes what
//! it computes alone in a row, and the loss, a mean over the batch's scored
//! predictions, is the same sum over the same instances.

use super::Batch;

impl Batch {
    /// Rows and widest row of a batch of `rows` rows of `width` packed
    /// `per_row` to a row: what an engine that trains such batches is
    /// built for.
    pub fn packed_shape(rows: usize, width: usize, per_row: usize) -> (usize, usize) {
        let k = per_row.max(1);
        (rows.div_ceil(k), width.saturating_mul(k))
    }

    /// This batch's instances laid `per_row` to a row, in
    /// [`Self::packed_shape`]'s rows, cut to the fullest row rounded up to
    /// a multiple of `step` predictions and padded with `pad`. An
    /// instance is its row up to its last scored prediction's target (the
    /// whole row when every prediction is scored); a row that scores
    /// nothing holds none. The longest instances are placed first, each in
    /// the emptiest row with room, so the rows end close together.
    pub fn packed(&self, per_row: usize, step: usize, pad: u32) -> Batch {
        let (k, t) = (per_row.max(1), self.seq_len());
        let (rows, capacity) = Self::packed_shape(self.rows, self.width, k);
        // Tokens of each source row's instance.
        let lens: Vec<usize> = (0..self.rows)
            .map(|r| match &self.mask {
                None => self.width,
                Some(m) => m[r * t..(r + 1) * t]
                    .iter()
                    .rposition(|&b| b)
                    .map_or(0, |p| p + 2),
            })
            .collect();
        let mut order: Vec<usize> = (0..self.rows).filter(|&r| lens[r] > 0).collect();
        order.sort_by_key(|&r| std::cmp::Reverse(lens[r]));
        let mut fill = vec![0usize; rows];
        let mut count = vec![0usize; rows];
        let mut placed: Vec<Vec<usize>> = vec![Vec::new(); rows];
        for r in order {
            // `rows * k >= self.rows`, so some row always has room.
            let Some(row) = (0..rows)
                .filter(|&i| count[i] < k)
                .min_by_key(|&i| (fill[i], i))
            else {
                break;
            };
            placed[row].push(r);
            fill[row] += lens[r];
            count[row] += 1;
        }
        let step = step.max(1);
        let need = fill
            .iter()
            .copied()
            .max()
            .unwrap_or(0)
            .saturating_sub(1)
            .max(1);
        let len = need
            .div_ceil(step)
            .saturating_mul(step)
            .min(capacity.saturating_sub(1));
        let width = len + 1;
        let mut tokens = vec![pad; rows * width];
        let mut mask = vec![false; rows * len];
        let mut resets = vec![false; rows * len];
        for (row, sources) in placed.iter().enumerate() {
            let mut at = 0;
            for &r in sources {
                let n = lens[r];
                let src = &self.tokens[r * self.width..r * self.width + n];
                tokens[row * width + at..row * width + at + n].copy_from_slice(src);
                resets[row * len + at] = true;
                // The instance's predictions, the last token's (which would
                // predict the next instance's first) left unscored.
                for p in 0..n - 1 {
                    mask[row * len + at + p] = self.scored(r * t + p);
                }
                at += n;
            }
        }
        Batch {
            rows,
            width,
            tokens,
            mask: Some(mask),
            resets: Some(resets),
        }
    }
}
