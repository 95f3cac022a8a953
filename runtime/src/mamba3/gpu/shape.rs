//! The kernels' view of a configuration: [`kernel_shape`] turns a
//! [`Mamba3Config`] at one (batch, seq_len) into the plain
//! [`Mamba3Shape`] every Mamba-3 kernel wrapper takes, so the kernels layer
//! needs no model type.

use crate::kernels::mamba3::{AngleSource, DecayMap, Mamba3Shape, ProjLayout, ScanForm};
use crate::mamba3::{AActivation, InProjLayout, Mamba3Config, ROPE_BASE, RopeAngles};

/// The shape of `cfg` at `batch x len` (the config must be valid).
pub fn kernel_shape(cfg: &Mamba3Config, batch: usize, len: usize) -> Mamba3Shape {
    let chunk = cfg.chunk_size.max(1);
    Mamba3Shape {
        batch,
        len,
        rows: batch.saturating_mul(len),
        d_model: cfg.d_model,
        vocab: cfg.padded_vocab_size(),
        nheads: cfg.nheads(),
        headdim: cfg.headdim,
        d_state: cfg.d_state,
        ngroups: cfg.ngroups,
        angles: cfg.num_rope_angles(),
        width: cfg.d_in_proj(),
        d_inner: cfg.d_inner(),
        chunk,
        nchunks: len.div_ceil(chunk),
        layout: proj_layout(&cfg.in_proj_layout()),
        eps: f64_to_f32(cfg.norm_eps),
        a_floor: f64_to_f32(cfg.a_floor),
        a_activation: match cfg.a_activation {
            AActivation::HeavyTail => DecayMap::HeavyTail,
            AActivation::Softplus => DecayMap::Softplus,
        },
        angles_from: match cfg.rope_angles {
            RopeAngles::Data => AngleSource::Cumsum,
            RopeAngles::Fixed => AngleSource::Fixed { base: ROPE_BASE },
        },
        scan_form: ScanForm::for_head(cfg.headdim, cfg.d_state),
    }
}

fn proj_layout(l: &InProjLayout) -> ProjLayout {
    ProjLayout {
        z: l.z,
        x: l.x,
        b: l.b,
        c: l.c,
        dd_dt: l.dd_dt,
        dd_a: l.dd_a,
        trap: l.trap,
        angles: l.angles,
        width: l.width,
    }
}

/// Rounds an f64 setting to the f32 the kernels compute with.
fn f64_to_f32(v: f64) -> f32 {
    #[expect(
        clippy::cast_possible_truncation,
        reason = "rounding to nearest is the intent; f64 -> f32 has no fallible conversion"
    )]
    let r = v as f32;
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shape_carries_the_configs_layout_and_settings() {
        let cfg = Mamba3Config {
            a_activation: AActivation::Softplus,
            ..Mamba3Config::tiny()
        };
        let sh = kernel_shape(&cfg, 3, 10);
        let l = cfg.in_proj_layout();
        assert_eq!(
            (sh.rows, sh.nchunks),
            (30, 10usize.div_ceil(cfg.chunk_size))
        );
        assert_eq!(
            (sh.layout.x, sh.layout.angles, sh.layout.width),
            (l.x, l.angles, l.width)
        );
        assert_eq!(sh.width, cfg.d_in_proj());
        assert_eq!(sh.a_activation, DecayMap::Softplus);
        assert_eq!(sh.angles_from, AngleSource::Cumsum);
        let fixed = Mamba3Config {
            rope_angles: RopeAngles::Fixed,
            ..cfg
        };
        assert_eq!(
            kernel_shape(&fixed, 1, 1).angles_from,
            AngleSource::Fixed { base: ROPE_BASE }
        );
        assert_eq!(f64::from(sh.eps), f64::from(f64_to_f32(cfg.norm_eps)));
    }
}
