//! The CPU model refuses bad input with typed errors instead of panicking.

use stepgraph::mamba3::Mamba3Config;
use stepgraph::mamba3::cpu::{
    ModelError, ModelState, ScanMode, TokenError, Tokens, Weights, forward, try_backward,
};

fn tokens(vocab: usize) -> Tokens {
    Tokens::from_rows(&[1, 2, 3, 4, 5, 6], 2, 3, vocab).unwrap()
}

#[test]
fn token_batches_are_validated() {
    assert_eq!(
        Tokens::from_rows(&[], 0, 4, 10),
        Err(TokenError::EmptyBatch)
    );
    assert_eq!(
        Tokens::from_rows(&[1, 2], 2, 1, 10),
        Err(TokenError::EmptySequence { cols: 1 })
    );
    assert!(matches!(
        Tokens::from_rows(&[1, 2, 3], 2, 2, 10),
        Err(TokenError::Length { .. })
    ));
    let err = Tokens::from_rows(&[1, 2, 3, 10], 2, 2, 10).unwrap_err();
    assert_eq!(
        err.to_string(),
        "tokens: id 10 at batch row 1, position 1 is outside the vocabulary [0, 10)"
    );
    assert!(matches!(
        Tokens::from_shaped(&[1, 2], &[2], 10),
        Err(TokenError::Rank { .. })
    ));
}

#[test]
fn forward_rejects_mismatched_weights_state_and_vocabulary() {
    let cfg = Mamba3Config::tiny();
    let w = Weights::<f64>::init(&cfg, 1).unwrap();

    let mut bad = w.clone();
    bad.layers[1].dt_bias.pop();
    let err = forward(&cfg, &bad, &tokens(cfg.vocab_size), None, ScanMode::Chunked).unwrap_err();
    assert!(
        err.to_string()
            .contains("`backbone.layers.1.mixer.dt_bias`"),
        "{err}"
    );

    let state = ModelState::<f64>::zeros(&cfg, 3);
    let err = forward(
        &cfg,
        &w,
        &tokens(cfg.vocab_size),
        Some(&state),
        ScanMode::Chunked,
    )
    .unwrap_err();
    assert!(matches!(err, ModelError::State(_)), "{err}");

    // Ids checked against a larger vocabulary than the model's.
    let wide = Tokens::from_rows(&[1, 2, 3, 4, 5, 13], 2, 3, 100).unwrap();
    let err = forward(&cfg, &w, &wide, None, ScanMode::Chunked).unwrap_err();
    assert_eq!(
        err,
        ModelError::TokenVocabulary {
            token: 13,
            vocab_size: 13
        }
    );

    let mut invalid = cfg.clone();
    invalid.headdim = 5;
    let err = forward(&invalid, &w, &tokens(13), None, ScanMode::Chunked).unwrap_err();
    assert!(err.to_string().contains("`ssm_cfg.headdim`"), "{err}");
}

#[test]
fn backward_of_another_models_forward_is_an_error() {
    let cfg = Mamba3Config::tiny();
    let w = Weights::<f64>::init(&cfg, 1).unwrap();
    let fwd = forward(&cfg, &w, &tokens(cfg.vocab_size), None, ScanMode::Chunked).unwrap();
    let other = Mamba3Config {
        n_layer: 3,
        ..Mamba3Config::tiny()
    };
    let w3 = Weights::<f64>::init(&other, 1).unwrap();
    let err = try_backward(&other, &w3, &fwd).unwrap_err();
    assert!(
        matches!(err, ModelError::ForwardMismatch { what: "blocks", .. }),
        "{err}"
    );
    assert!(try_backward(&cfg, &w, &fwd).is_ok());
}
