"""Independent numpy forward of the official MambaLMHeadModel + Mamba3 (SISO).

Written from the official Python structure (mamba_ssm/models/mixer_seq_simple.py,
mamba_ssm/modules/block.py, mamba_ssm/modules/mamba3.py and the recurrent step
reference), not from the Rust code, to cross-check the Rust oracle's layouts and
conventions end to end as a PyTorch user would see the checkpoint. Not run by
`cargo test` (it needs numpy); run by hand:

    stepgraph init --out CK --d-model 16 --n-layer 2 --vocab-size 37 --d-state 8 --headdim 8
    python3 numpy_reference.py CK TOKENS.safetensors path/to/stepgraph

It perturbs every tensor of CK in place (so no symmetric init value hides a
layout error), rewrites CK/model.safetensors in f64, and prints its own loss
next to `stepgraph eval`'s.
"""
import json, struct, sys, subprocess, math
import numpy as np

def read_st(path):
    b = open(path, 'rb').read()
    n = struct.unpack('<Q', b[:8])[0]
    hdr = json.loads(b[8:8+n]); base = 8+n; out = {}
    for k, v in hdr.items():
        if k == '__metadata__': continue
        s, e = v['data_offsets']; dt = {'F32': np.float32, 'F64': np.float64, 'I64': np.int64, 'I32': np.int32}[v['dtype']]
        out[k] = np.frombuffer(b[base+s:base+e], dtype=dt).reshape(v['shape']).astype(np.float64 if dt in (np.float32, np.float64) else np.int64)
    return out

def write_st(path, tensors):
    hdr = {}; off = 0; blobs = []
    for k in sorted(tensors):
        a = np.ascontiguousarray(tensors[k], dtype=np.float64); by = a.tobytes()
        hdr[k] = {'dtype': 'F64', 'shape': list(a.shape), 'data_offsets': [off, off+len(by)]}; off += len(by); blobs.append(by)
    h = json.dumps(hdr).encode(); h += b' ' * ((8 - len(h) % 8) % 8)
    open(path, 'wb').write(struct.pack('<Q', len(h)) + h + b''.join(blobs))

def rms(x, w, eps=1e-5):
    return x / np.sqrt((x*x).mean(-1, keepdims=True) + eps) * w

def softplus(x): return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))
def sigmoid(x): return 1/(1+np.exp(-x))
def heavy_tail(x): return np.clip(x, 0, None) + 1/(1 - np.clip(x, None, 0))

def mixer(u, W, pre, c):
    ssm = c['ssm_cfg']; D = c['d_model']; N = ssm['d_state']; P = ssm['headdim']; G = ssm['ngroups']
    di = ssm['expand'] * D; H = di // P
    split = int(N * ssm['rope_fraction']); split -= split % 2; S = split // 2
    zx = u @ W[pre+'in_proj.weight'].T
    sizes = [di, di, N*G, N*G, H, H, H, S]
    parts = np.split(zx, np.cumsum(sizes)[:-1], axis=-1)
    z, x, B, C, dd_dt, dd_A, trap, ang = parts
    b, l = u.shape[:2]
    z = z.reshape(b, l, H, P); x = x.reshape(b, l, H, P)
    B = B.reshape(b, l, 1, G, N); C = C.reshape(b, l, 1, G, N)
    A = np.minimum(-heavy_tail(dd_A), -ssm['A_floor'])
    DT = softplus(dd_dt + W[pre+'dt_bias'])
    ADT = A * DT
    B = rms(B, W[pre+'B_norm.weight']); C = rms(C, W[pre+'C_norm.weight'])
    Q = np.repeat(C[:, :, 0], H // G, axis=2); K = np.repeat(B[:, :, 0], H // G, axis=2)
    Qb = W[pre+'C_bias'][:, 0]; Kb = W[pre+'B_bias'][:, 0]
    Ang = np.tanh(ang) * math.pi
    phi = np.zeros((b, H, S)); Sst = np.zeros((b, H, P, N)); Kst = np.zeros((b, H, N)); Vst = np.zeros((b, H, P))
    out = np.zeros((b, l, H, P))
    def rot(t, cs, sn):
        t0 = t[..., 0::2].copy(); t1 = t[..., 1::2].copy()
        cs = np.concatenate([cs, np.ones(t0.shape[:-1] + (t0.shape[-1]-cs.shape[-1],))], -1)
        sn = np.concatenate([sn, np.zeros(t0.shape[:-1] + (t0.shape[-1]-sn.shape[-1],))], -1)
        r = np.empty_like(t); r[..., 0::2] = t0*cs - t1*sn; r[..., 1::2] = t0*sn + t1*cs; return r
    for t in range(l):
        q = Q[:, t] + Qb; k = K[:, t] + Kb; v = x[:, t]
        dt = DT[:, t]; adt = ADT[:, t]; tr = sigmoid(trap[:, t])
        phi = phi + Ang[:, t][:, None, :] * dt[..., None]
        phi = phi - 2*math.pi*np.floor(phi/(2*math.pi))
        qr = rot(q, np.cos(phi), np.sin(phi)); kr = rot(k, np.cos(phi), np.sin(phi))
        al = np.exp(adt); be = (1-tr)*dt*al; ga = tr*dt
        Sst = al[..., None, None]*Sst + be[..., None, None]*(Vst[..., :, None]*Kst[..., None, :]) + ga[..., None, None]*(v[..., :, None]*kr[..., None, :])
        o = np.einsum('bhpn,bhn->bhp', Sst, qr) + W[pre+'D'][None, :, None]*v
        if not ssm['is_outproj_norm']:
            o = o * z[:, t] * sigmoid(z[:, t])
        out[:, t] = o; Kst = kr; Vst = v
    y = out.reshape(b, l, di)
    if ssm['is_outproj_norm']:
        zz = z.reshape(b, l, di)
        yg = y.reshape(b, l, H, P); yg = yg / np.sqrt((yg*yg).mean(-1, keepdims=True) + 1e-5)
        y = yg.reshape(b, l, di) * W[pre+'norm.weight'] * zz * sigmoid(zz)
    return y @ W[pre+'out_proj.weight'].T

def model_loss(W, c, tok):
    inp, tgt = tok[:, :-1], tok[:, 1:]
    hidden = W['backbone.embedding.weight'][inp]; residual = None
    for i in range(c['n_layer']):
        residual = hidden + residual if residual is not None else hidden
        h = rms(residual, W[f'backbone.layers.{i}.norm.weight'])
        hidden = mixer(h, W, f'backbone.layers.{i}.mixer.', c)
    residual = hidden + residual
    hf = rms(residual, W['backbone.norm_f.weight'])
    head = W['lm_head.weight'] if not c['tie_embeddings'] else W['backbone.embedding.weight']
    logits = hf @ head.T
    m = logits.max(-1, keepdims=True)
    lse = (m[..., 0] + np.log(np.exp(logits - m).sum(-1)))
    return float((lse - np.take_along_axis(logits, tgt[..., None], -1)[..., 0]).mean())

if __name__ == '__main__':
    ck, tokpath, exe = sys.argv[1], sys.argv[2], sys.argv[3]
    c = json.load(open(ck + '/config.json'))
    W = read_st(ck + '/model.safetensors')
    rng = np.random.default_rng(0)
    for k in W:
        W[k] = W[k] + 0.3 * np.abs(W[k]).max() * (rng.random(W[k].shape) * 2 - 1)
    write_st(ck + '/model.safetensors', W)
    tok = read_st(tokpath)['tokens']
    ref = model_loss(W, c, tok)
    got = json.loads(subprocess.check_output([exe, 'eval', '--checkpoint', ck, '--tokens', tokpath]))['loss']
    print(f'numpy reference {ref!r}  stepgraph eval {got!r}  rel diff {abs(ref-got)/abs(ref):.2e}')
