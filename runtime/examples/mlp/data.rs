//! The MLP example's synthetic task and initial weights, on the host.
//!
//! Points `x` in `[-1, 1)^input`, labelled by a fixed random teacher
//! network (`argmax(tanh(x A) B)`): nonlinear, so the hidden layer has
//! something to learn, and noise-free, so the loss can fall far. Batch `i`
//! of seed `s` is always the same, so an eager run and a graph replay (or
//! the CPU reference) can be fed identical data.

/// The model's sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dims {
    /// Rows per step.
    pub batch: usize,
    /// Features per row.
    pub input: usize,
    /// Hidden units.
    pub hidden: usize,
    /// Classes.
    pub classes: usize,
}

/// What the example trains.
pub const DIMS: Dims = Dims {
    batch: 256,
    input: 32,
    hidden: 64,
    classes: 8,
};

/// Hidden units of the teacher that labels the data.
const TEACHER_HIDDEN: usize = 16;

/// SplitMix64: a few lines, no dependency, the same numbers everywhere.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[-1, 1)`.
    pub fn uniform(&mut self) -> f32 {
        // 16 bits, which an f32 holds exactly (`From`, no lossy cast).
        let unit = f32::from(u16::try_from(self.next_u64() >> 48).unwrap_or(0)) / 65_536.0;
        2.0 * unit - 1.0
    }
}

/// The teacher network: fixed by its seed, shared by every batch.
#[derive(Clone, Debug)]
pub struct Teacher {
    dims: Dims,
    a: Vec<f32>,
    b: Vec<f32>,
}

impl Teacher {
    /// The teacher of `seed`.
    pub fn new(dims: Dims, seed: u64) -> Self {
        let mut rng = Rng::new(seed ^ 0x7eac_4e55);
        let a = (0..dims.input * TEACHER_HIDDEN)
            .map(|_| 2.0 * rng.uniform())
            .collect();
        let b = (0..TEACHER_HIDDEN * dims.classes)
            .map(|_| 2.0 * rng.uniform())
            .collect();
        Self { dims, a, b }
    }

    /// The class of one point.
    fn label(&self, x: &[f32]) -> i32 {
        let d = self.dims;
        let hidden: Vec<f32> = (0..TEACHER_HIDDEN)
            .map(|j| {
                let s: f32 = (0..d.input)
                    .map(|i| x[i] * self.a[i * TEACHER_HIDDEN + j])
                    .sum();
                (s / 2.0).tanh()
            })
            .collect();
        let mut best = (0usize, f32::NEG_INFINITY);
        for c in 0..d.classes {
            let z: f32 = (0..TEACHER_HIDDEN)
                .map(|j| hidden[j] * self.b[j * d.classes + c])
                .sum();
            if z > best.1 {
                best = (c, z);
            }
        }
        i32::try_from(best.0).unwrap_or(0)
    }

    /// Batch `index`: `(x [batch x input], labels [batch])`.
    pub fn batch(&self, index: u64) -> (Vec<f32>, Vec<i32>) {
        let d = self.dims;
        let mut rng = Rng::new(index.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ 0xba7c);
        let x: Vec<f32> = (0..d.batch * d.input).map(|_| rng.uniform()).collect();
        let labels = x.chunks(d.input).map(|row| self.label(row)).collect();
        (x, labels)
    }
}

/// The model's parameters on the host, in f32 (what the GPU starts from).
#[derive(Clone, Debug, PartialEq)]
pub struct HostParams {
    /// `[input x hidden]`.
    pub w1: Vec<f32>,
    /// `[hidden]`.
    pub b1: Vec<f32>,
    /// `[hidden x classes]`.
    pub w2: Vec<f32>,
    /// `[classes]`.
    pub b2: Vec<f32>,
}

impl HostParams {
    /// Uniform `±1/sqrt(fan_in)` weights (PyTorch's `nn.Linear` range),
    /// zero biases.
    pub fn init(dims: Dims, seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        let mut matrix = |fan_in: usize, fan_out: usize| -> Vec<f32> {
            let bound = 1.0 / f32::from(u16::try_from(fan_in).unwrap_or(u16::MAX)).sqrt();
            (0..fan_in * fan_out)
                .map(|_| bound * rng.uniform())
                .collect()
        };
        let w1 = matrix(dims.input, dims.hidden);
        let w2 = matrix(dims.hidden, dims.classes);
        Self {
            w1,
            b1: vec![0.0; dims.hidden],
            w2,
            b2: vec![0.0; dims.classes],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_are_reproducible_and_use_every_class() {
        let t = Teacher::new(DIMS, 1);
        let (x, y) = t.batch(3);
        assert_eq!((x.len(), y.len()), (DIMS.batch * DIMS.input, DIMS.batch));
        assert_eq!(Teacher::new(DIMS, 1).batch(3), (x.clone(), y.clone()));
        assert_ne!(t.batch(4).0, x);
        assert!(x.iter().all(|v| (-1.0..1.0).contains(v)));
        let mut seen = vec![0usize; DIMS.classes];
        for b in 0..8 {
            for label in t.batch(b).1 {
                seen[usize::try_from(label).unwrap()] += 1;
            }
        }
        // No class is empty, and none holds most of the data.
        assert!(
            seen.iter().all(|&n| n > 0 && n < 8 * DIMS.batch / 2),
            "{seen:?}"
        );
    }
}
