/* 成本计算器: a port of snippets/cost/formulas.py and of the Megatron 0.19.0 functions it calls
   (megatron/training/theoretical_memory_usage.py compute_weight_and_optimizer_memory,
   compute_activation_memory, compute_activation_memory_without_sp; megatron/training/training.py
   num_floating_point_operations, transformer branch; megatron/core/tokenizers/utils/build_tokenizer.py
   vocab_size_with_padding), restricted to what the Python passes them (no MLA, MTP, latent MoE,
   hybrid or linear attention). tests/site/test_calculator.py checks every number this page shows
   against the Python on a grid of configurations; a number the formula does not cover is not
   computed: the page shows the Python's reason instead. No data files, no network: it works from disk. */
(function () {
  "use strict";
  const root = document.getElementById("ms-calc");
  if (!root) return;
  const esc = s => String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");

  // ------------------------------------------------------------------ the Python's constants
  // snippets.cost.formulas.MODELS (a test compares them)
  const MODELS = {
    "tiny": { hidden: 16, heads: 2, query_groups: 2, kv_channels: 8, ffn: 32, vocab: 32, layers: 4,
      swiglu: false, rmsnorm: false, qk_norm: false, bias: false, untied: true,
      num_experts: null, moe_ffn: null, topk: null, shared_expert_ffn: 0, moe_layer_freq: 1 },
    "qwen3-8b": { hidden: 4096, heads: 32, query_groups: 8, kv_channels: 128, ffn: 12288, vocab: 151936, layers: 36,
      swiglu: true, rmsnorm: true, qk_norm: true, bias: false, untied: true,
      num_experts: null, moe_ffn: null, topk: null, shared_expert_ffn: 0, moe_layer_freq: 1 },
    "dense-8b": { hidden: 4096, heads: 32, query_groups: 8, kv_channels: 128, ffn: 14336, vocab: 128256, layers: 32,
      swiglu: true, rmsnorm: true, qk_norm: false, bias: false, untied: true,
      num_experts: null, moe_ffn: null, topk: null, shared_expert_ffn: 0, moe_layer_freq: 1 },
    "dense-70b": { hidden: 8192, heads: 64, query_groups: 8, kv_channels: 128, ffn: 28672, vocab: 128256, layers: 80,
      swiglu: true, rmsnorm: true, qk_norm: false, bias: false, untied: true,
      num_experts: null, moe_ffn: null, topk: null, shared_expert_ffn: 0, moe_layer_freq: 1 },
    "qwen3-30b-a3b": { hidden: 2048, heads: 32, query_groups: 4, kv_channels: 128, ffn: 6144, vocab: 151936, layers: 48,
      swiglu: true, rmsnorm: true, qk_norm: true, bias: false, untied: true,
      num_experts: 128, moe_ffn: 768, topk: 8, shared_expert_ffn: 0, moe_layer_freq: 1 },
  };
  // snippets.cost.formulas.HARDWARE
  const HARDWARE = { peak_bf16_flops: 989e12, nvlink_bytes_per_s: 450e9, ib_bytes_per_s: 50e9, hbm_bytes: 80 * 2 ** 30 };
  // snippets.cost.formulas: MEMORY_HEADROOM, MEMORY_BUDGET (80 GiB less 10 % = 72 GiB), MAX_SIZE, MAX_LAYERS
  const MEMORY_HEADROOM = 0.10;
  const MEMORY_BUDGET = HARDWARE.hbm_bytes * (1 - MEMORY_HEADROOM);
  const MAX_SIZE = 2 ** 31, MAX_LAYERS = 2 ** 20;
  const BF16 = 2, FP32 = 4;
  const RECOMPUTE = ["none", "selective", "full"];
  const MODEL_SIZES = ["hidden", "heads", "query_groups", "kv_channels", "ffn", "vocab", "layers"];
  const GROUPS = ["tp", "cp", "pp", "dp", "ep", "edp"];

  // ------------------------------------------------------------------ formulas.py, ported
  const isPosInt = v => Number.isInteger(v) && v >= 1;
  // Python's repr: None, 'text', and nan / inf / -inf for what is not a finite number
  const repr = v => (v === null || v === undefined ? "None" : typeof v === "string" ? `'${v}'`
    : typeof v === "number" && !Number.isFinite(v) ? (Number.isNaN(v) ? "nan" : v > 0 ? "inf" : "-inf") : String(v));
  // Python's f"{x:g}": 6 significant digits, exponent form below 1e-4 or from 1e6 on ("1.23457e+06")
  function gfmt(x) {
    if (!Number.isFinite(x)) return Number.isNaN(x) ? "nan" : x > 0 ? "inf" : "-inf";
    if (x === 0) return "0";
    const [mant, e] = x.toExponential(5).split("e");
    const exp = Number(e);
    if (exp < -4 || exp >= 6) {
      const m = mant.includes(".") ? mant.replace(/0+$/, "").replace(/\.$/, "") : mant;
      return `${m}e${exp < 0 ? "-" : "+"}${String(Math.abs(exp)).padStart(2, "0")}`;
    }
    return String(Number(x.toPrecision(6)));
  }
  const world = c => c.gpus_per_node * c.nodes;
  const dpOf = c => Math.floor(world(c) / (c.tp * c.pp * c.cp));
  const edpOf = c => Math.floor(world(c) / (c.tp * c.ep * c.pp));
  const globalBatch = c => c.micro_batch_size * c.num_microbatches * dpOf(c);
  // Model.moe_layers: Megatron's i % moe_layer_freq == 0 over range(layers), in closed form
  const moeLayers = m => (m.num_experts === null ? 0 : Math.ceil(m.layers / m.moe_layer_freq));

  // snippets.ranks.parallel_dims.ParallelDims.problems, word for word
  function parallelDims(d) {
    for (const name of ["world", "tp", "pp", "cp", "ep"]) {
      if (!isPosInt(d[name])) return { raise: `${name === "world" ? "world size" : name} must be a positive int, got ${repr(d[name])}` };
    }
    if (d.vp !== null && !isPosInt(d.vp)) return { raise: `vp must be a positive int, got ${repr(d.vp)}` };
    const out = [];
    const w = `world size ${d.world}`;
    const model = d.tp * d.pp * d.cp;
    if (d.world % model) out.push(`${w} is not divisible by tp*pp*cp = ${d.tp}*${d.pp}*${d.cp} = ${model}`);
    const expertModel = d.tp * d.pp;
    if (out.length) { /* the expert layout cuts the same ranks */ }
    else if (d.world % expertModel) out.push(`${w} is not divisible by tp*pp = ${d.tp}*${d.pp} = ${expertModel} (the expert layout)`);
    else if ((d.world / expertModel) % d.ep) {
      out.push(`ep ${d.ep} does not divide the ${d.world / expertModel} ranks left for experts (${w} / (tp ${d.tp} * pp ${d.pp}))`);
    }
    if (d.vp && d.pp < 2) out.push("--vp (interleaved 1F1B) needs --pp 2 or more");
    if (d.sp && d.tp < 2) out.push("--sequence-parallel needs --tp 2 or more");
    return { problems: out };
  }

  // formulas._size_problem
  function sizeProblem(name, value) {
    if (!isPosInt(value)) return `${name} must be a positive int, got ${repr(value)}`;
    const limit = name === "layers" ? MAX_LAYERS : MAX_SIZE;
    if (value > limit) return `${name} must be at most ${limit}, got ${value}`;
    return null;
  }

  function problems(m, c) {
    let out = [];
    const moe = m.num_experts !== null;
    for (const name of MODEL_SIZES.concat(moe ? ["num_experts", "moe_ffn", "topk"] : [])) {
      const found = sizeProblem(name, m[name]);
      if (found) out.push(found);
    }
    if (out.length) return out;
    if (m.heads % m.query_groups) out.push(`heads ${m.heads} is not divisible by query_groups ${m.query_groups}`);
    if (moe && m.topk > m.num_experts) out.push(`topk ${m.topk} is more than num_experts ${m.num_experts}`);
    if (out.length) return out;
    for (const name of ["gpus_per_node", "nodes", "micro_batch_size", "num_microbatches", "seq", "vocab_multiple"]) {
      const found = sizeProblem(name, c[name]);
      if (found) out.push(found);
    }
    if (out.length) return out;
    if (!RECOMPUTE.includes(c.recompute)) out.push(`recompute must be one of ${RECOMPUTE.join(", ")}, got ${repr(c.recompute)}`);
    for (const name of ["tp", "pp", "cp", "ep", "vp"]) {
      if (Number.isInteger(c[name]) && c[name] > MAX_SIZE) return out.concat([`${name} must be at most ${MAX_SIZE}, got ${c[name]}`]);
    }
    if (world(c) > MAX_SIZE) return out.concat([`world size gpus_per_node*nodes must be at most ${MAX_SIZE}, got ${world(c)}`]);
    const pd = parallelDims({ world: world(c), tp: c.tp, pp: c.pp, vp: c.vp, cp: c.cp, ep: c.ep, sp: c.sp });
    if (pd.raise) return out.concat([pd.raise]);
    out = out.concat(pd.problems);
    const chunks = c.pp * (c.vp || 1);
    if (m.layers % chunks) out.push(`layers ${m.layers} is not divisible by ${c.vp ? `pp*vp = ${c.pp}*${c.vp}` : "pp"} = ${chunks}`);
    if (m.heads % c.tp) out.push(`heads ${m.heads} is not divisible by tp ${c.tp}`);
    if (m.query_groups % c.tp) out.push(`query_groups ${m.query_groups} is not divisible by tp ${c.tp}`);
    if (c.ep > 1 && !moe) out.push(`ep ${c.ep} needs a model with experts; ${m.name} has none`);
    if (moe && m.num_experts % c.ep) out.push(`num_experts ${m.num_experts} is not divisible by ep ${c.ep}`);
    if (moe && c.tp > 1 && !c.sp) {
      out.push(`MoE with tp ${c.tp} needs sequence parallel: Megatron's MoE layer raises in training without it (moe_layer.py:629)`);
    }
    if (c.vp && c.pp === 2 && !c.overlap_p2p_comm) {
      out.push(`interleaving (vp ${c.vp}) at pp 2 needs overlap_p2p_comm: Megatron-LM asserts pp > 2 without it (arguments.py:971)`);
    }
    if (c.vp && c.pp >= 2 && c.num_microbatches < c.pp) {
      out.push(`interleaving (vp ${c.vp}) needs num_microbatches >= pp: ${c.num_microbatches} < ${c.pp} makes the interleaved schedule raise ValueError (schedules.py:1133)`);
    }
    if (c.cp > 1 && c.seq % (2 * c.cp)) out.push(`seq ${c.seq} is not divisible by 2*cp = ${2 * c.cp} (the load-balanced CP split)`);
    if (c.sp && Math.floor(c.seq / c.cp) % c.tp) out.push(`seq/cp = ${Math.floor(c.seq / c.cp)} is not divisible by tp ${c.tp} (sequence parallel)`);
    return out;
  }

  // megatron.core.tokenizers.utils.build_tokenizer.vocab_size_with_padding
  function paddedVocab(m, c) {
    const multiple = c.vocab_multiple * c.tp;
    return Math.ceil(m.vocab / multiple) * multiple;
  }

  // megatron/training/theoretical_memory_usage.py compute_weight_and_optimizer_memory
  function megatronWeightMemory(m, c, distributed) {
    const h = m.hidden, V = paddedVocab(m, c);
    const queryProjection = m.kv_channels * m.heads;
    const ratio = queryProjection / h;
    const numQueryGroups = m.query_groups;
    const numExperts = m.num_experts === null ? 1 : m.num_experts;
    const gated = m.swiglu ? 3 / 2 : 1;
    const sharedFfn = m.shared_expert_ffn ? m.shared_expert_ffn : 0;
    let numDense, numMoe, moeFfn;
    if (m.num_experts !== null) { numMoe = moeLayers(m); numDense = m.layers - numMoe; moeFfn = m.moe_ffn; }
    else { numDense = m.layers; numMoe = 0; moeFfn = 0; }
    const norm = m.rmsnorm ? 1 : 2;
    const selfAttn = 2 * h * h * ((1 + numQueryGroups / m.heads) * ratio);
    const embedding = h * V;
    const finalNorm = norm * h;
    const denseMlp = 2 * h * m.ffn * gated;
    const sharedExpert = 2 * h * sharedFfn * gated;
    const routed = 2 * h * moeFfn * numExperts * gated;
    const layernorm = 2 * h * norm;
    const router = m.num_experts !== null ? h * numExperts + (m.bias ? numExperts : 0) : 0;
    const tpSharded = (selfAttn + denseMlp) * numDense + (selfAttn + sharedExpert) * numMoe;
    const replicated = layernorm * numDense + (layernorm + router) * numMoe + finalNorm;
    const expertSharded = routed * numMoe;
    const edp = Math.floor(world(c) / (c.tp * c.ep * c.pp));
    // Megatron adds MTP layers' parameters to each of these three; formulas.py sets mtp_num_layers=None
    let tpMost = (tpSharded / c.pp + embedding) / c.tp;
    const replicatedMost = replicated / c.pp;
    const expertMost = (expertSharded / c.pp) / (c.tp * c.ep);
    if (m.untied && c.pp === 1) tpMost += embedding / c.tp;
    const bytesPerParam = d => (!distributed ? 18 : 6 + 12 / d);
    return (tpMost + replicatedMost) * bytesPerParam(dpOf(c)) + expertMost * bytesPerParam(edp);
  }

  // compute_activation_memory (Table 2 of arXiv 2205.05198, SP + selective recomputation)
  function megatronActivation(m, c) {
    const s = c.seq, b = c.micro_batch_size, h = m.hidden, pp = c.pp, V = paddedVocab(m, c);
    let a = (s * b * h) * (18 + (4 * (m.ffn / h)));
    a *= m.layers;
    a += 8 * s * b * pp;
    a += s * b * h * pp;
    if (c.vp !== null) a *= 1 + ((pp - 1) / (pp * c.vp));
    if (c.vp === null && pp > 1) a *= Math.min(1, c.num_microbatches / pp);
    if (pp === 1) a += s * b * h * 4 * (1 + (V / h));
    return a / c.tp;
  }

  // compute_activation_memory_without_sp
  function megatronActivationWithoutSp(m, c) {
    const s = c.seq, b = c.micro_batch_size, h = m.hidden, pp = c.pp, V = paddedVocab(m, c);
    const perLayer = s * b * h * (10 + (24 / c.tp));
    let total = perLayer * m.layers;
    total += 8 * s * b * pp;
    total += s * b * h * pp;
    if (c.vp !== null) total *= 1 + ((pp - 1) / (pp * c.vp));
    if (c.vp === null && pp > 1) total *= Math.min(1, c.num_microbatches / pp);
    if (pp === 1) {
      let logits = s * b * V;
      logits /= c.tp;
      const finalLn = s * b * h;
      total += (logits + finalLn) * 2;
    }
    total *= 1.05;
    return total;
  }

  // megatron/training/training.py num_floating_point_operations -> transformer_flops (BSHD)
  function megatronFlops(m, c, batch) {
    const s = c.seq, h = m.hidden, V = paddedVocab(m, c);
    const seqlenSquaredSum = batch * s * s;
    const totalTokens = batch * s;
    const numQueryGroups = m.query_groups;
    let numDense, numMoe, routedTo;
    if (m.num_experts === null) { numDense = m.layers; numMoe = 0; routedTo = 0; }
    else { numMoe = moeLayers(m); numDense = m.layers - numMoe; routedTo = m.topk; }
    const moeFfn = m.moe_ffn !== null ? m.moe_ffn : m.ffn;
    const sharedFfn = m.shared_expert_ffn ? m.shared_expert_ffn : 0;
    const fb = 3, fma = 2, ffnExp = m.swiglu ? 3 : 2;
    // dropped from Megatron's transformer_flops (formulas.py sets them off): the attention output
    // gate's extra projection, latent MoE, linear/hybrid attention layers, and MTP layers
    const q = m.kv_channels * m.heads, k = m.kv_channels * numQueryGroups, v = m.kv_channels * numQueryGroups;
    const stdAttn = fb * fma * (h * (q + k + v) + q * h);
    const stdCore = fb * fma * q / 2 * 2;  // causal: half of QK^T and AV, times 2 matmuls
    const selfAttnTerm = stdAttn * m.layers;
    const coreTerm = stdCore * m.layers;
    return (
      totalTokens * (
        fb * fma * h * (
          (m.ffn * ffnExp) * numDense
          + (moeFfn * routedTo * ffnExp) * numMoe
          + (sharedFfn * ffnExp) * numMoe
        )
        + selfAttnTerm
        + fb * fma * h * V  // the output layer (times 1 + MTP layers, none here)
      )
      + seqlenSquaredSum * coreTerm
    );
  }

  const figure = (value, why = null, note = null) => ({ value, why, note });

  function weights(m, c) {
    const found = problems(m, c);
    if (found.length) return figure(null, found[0]);
    if (!c.grad_reduce_in_fp32) {
      return figure(null, "Megatron's 18 (or 6 + 12/DP) bytes per parameter counts fp32 gradients; without grad_reduce_in_fp32 they are bf16");
    }
    if (c.cp > 1 && c.distributed_optimizer) {
      return figure(null, "with CP > 1 the distributed optimizer shards over DP x CP ranks; Megatron's formula divides by DP only");
    }
    return figure(megatronWeightMemory(m, c, c.distributed_optimizer));
  }

  function activations(m, c) {
    const found = problems(m, c);
    if (found.length) return figure(null, found[0]);
    if (c.recompute === "full") return figure(null, "Megatron's activation formula has no full-recomputation term");
    if (c.cp > 1) return figure(null, "Megatron's activation formula has no context-parallel term");
    if (m.num_experts !== null) return figure(null, "Megatron's activation formula has no MoE term (expert activations follow routing)");
    if (c.sp) {
      if (c.recompute !== "selective") {
        return figure(null, "Megatron's SP formula (34 sbh/t per layer) assumes selective recomputation; it has no SP-only variant");
      }
      return figure(megatronActivation(m, c), null, kvWidthNote(m));
    }
    const value = megatronActivationWithoutSp(m, c);
    const notes = ["no s x s attention scores kept (selective recomputation or a fused attention kernel)"];
    if (m.ffn !== 4 * m.hidden) notes.push(`its 24/t per layer counts an MLP of 4h, this model's ffn is ${gfmt(m.ffn / m.hidden)}h`);
    notes.push(kvWidthNote(m));
    return figure(value, null, notes.filter(Boolean).join("; "));
  }

  function kvWidthNote(m) {
    const q = m.heads * m.kv_channels, kv = m.query_groups * m.kv_channels;
    if (q === m.hidden && kv === m.hidden) return null;
    return `Q, K, V counted h = ${m.hidden} wide each; this model's are ${q}, ${kv}, ${kv}`;
  }

  function memory(m, c) {
    const w = weights(m, c), a = activations(m, c);
    if (w.value === null) return w;
    if (a.value === null) return figure(null, a.why);
    return figure(w.value + a.value, null, a.note);
  }

  // formulas.memory_fits
  function memoryFits(m, c) {
    const mem = memory(m, c);
    if (mem.value === null) return { fits: null, why: mem.why, budget: MEMORY_BUDGET };
    return { fits: mem.value <= MEMORY_BUDGET, why: null, budget: MEMORY_BUDGET };
  }

  function flops(m, c) {
    const found = problems(m, c);
    if (found.length) return figure(null, found[0]);
    const note = c.recompute === "full" ? "model FLOPs: the recomputed forward (about 1/3 more) is not counted" : null;
    return figure(megatronFlops(m, c, globalBatch(c)), null, note);
  }

  const bubble = c => { const p = c.pp, mb = c.num_microbatches, v = c.vp || 1; return (p - 1) / (v * mb + p - 1); };

  function geometry(c) {
    return {
      tp: [1, c.tp], cp: [c.tp, c.cp], dp: [c.tp, c.cp * dpOf(c)], pp: [c.tp * c.cp * dpOf(c), c.pp],
      ep: [c.tp, c.ep], edp: [c.tp * c.ep, edpOf(c)],
    };
  }
  const intraNode = (stride, size, g) => { const span = stride * size; return span <= g && g % span === 0; };
  const ring = (op, n) => (op === "all_reduce" ? 2 * (n - 1) / n : (n - 1) / n);

  function paramsPerGpu(m, c) {
    const total = megatronWeightMemory(m, c, false) / 18;
    let expert = 0;
    if (m.num_experts !== null) {
      const perLayer = 2 * m.hidden * m.moe_ffn * m.num_experts * (m.swiglu ? 1.5 : 1);
      expert = perLayer * moeLayers(m) / (c.pp * c.tp * c.ep);
    }
    return { dense: total - expert, expert };
  }

  function communication(m, c) {
    const found = problems(m, c);
    const out = {};
    const geo = geometry(c);
    for (const name of GROUPS) {
      const [stride, size] = geo[name];
      out[name] = { size, stride, link: size > 1 ? (intraNode(stride, size, c.gpus_per_node) ? "NVLink" : "IB") : null,
        bytes: null, seconds: null, why: null, basis: "" };
    }
    if (found.length) { for (const name of GROUPS) out[name].why = found[0]; return out; }
    const s = Math.floor(c.seq / c.cp), b = c.micro_batch_size, h = m.hidden, t = c.tp;
    const layersPerStage = Math.floor(m.layers / c.pp);
    const fwd = c.recompute === "full" ? 2 : 1;
    const act = s * b * h * BF16;
    const gradBytes = c.grad_reduce_in_fp32 ? FP32 : BF16;
    const moePerStage = m.num_experts !== null ? Math.floor(moeLayers(m) / c.pp) : 0;
    const put = (name, value, basis, why = null) => {
      const row = out[name];
      row.basis = basis;
      if (row.size === 1) { row.bytes = 0; row.seconds = 0; return; }
      if (value === null) { row.why = why; return; }
      row.bytes = value;
      row.seconds = value / (row.link === "NVLink" ? HARDWARE.nvlink_bytes_per_s : HARDWARE.ib_bytes_per_s);
    };
    let perLayer, basis;
    if (c.sp) {
      perLayer = (fwd * 4 + 6) * ring("all_gather", t) * act;
      basis = "per layer per micro-batch: 2 AG + 2 RS forward, 4 AG + 2 RS backward of s'bh (note 11)";
    } else {
      perLayer = (fwd * 2 + 2) * ring("all_reduce", t) * act;
      basis = "per layer per micro-batch: 2 all-reduces forward + 2 backward of s'bh (note 11)";
    }
    if (m.num_experts !== null && t > 1) {
      put("tp", null, basis, "MoE layers move their TP traffic through the token dispatcher; not counted");
    } else {
      put("tp", perLayer * layersPerStage * c.num_microbatches, basis);
    }
    const kv = 2 * s * b * m.query_groups * m.kv_channels / t * BF16;
    put("cp", (fwd + 2) * (c.cp - 1) * kv * layersPerStage * c.num_microbatches,
      "per layer per micro-batch: cp-1 ring hops of K,V forward, of K,V and dK,dV backward (note 16)");
    const p2p = act / (c.sp ? t : 1);
    put("pp", 2 * (c.vp || 1) * c.num_microbatches * p2p,
      "a middle stage: one activation forward and one gradient backward per micro-batch per chunk (note 13)");
    const params = paramsPerGpu(m, c);
    const gradSync = (n, count) => (c.distributed_optimizer
      ? ring("reduce_scatter", n) * count * gradBytes + ring("all_gather", n) * count * BF16
      : ring("all_reduce", n) * count * gradBytes);
    const how = c.distributed_optimizer
      ? "reduce-scatter of gradients + all-gather of bf16 parameters (distributed optimizer, note 15)"
      : "all-reduce of gradients (note 14)";
    put("dp", gradSync(out.dp.size, params.dense), "once per step over DP x CP: " + how);
    const noExperts = "this model has no routed experts";
    put("edp", gradSync(out.edp.size, params.expert), m.num_experts !== null ? "routed experts' gradients: " + how : noExperts);
    const tokens = s * b / (c.sp ? t : 1);
    const a2a = tokens * (m.topk || 0) * h * BF16 * (c.ep - 1) / c.ep;
    put("ep", (2 * fwd + 2) * a2a * moePerStage * c.num_microbatches,
      m.num_experts !== null ? "per MoE layer per micro-batch: dispatch + combine all-to-all, forward and backward (note 17)" : noExperts);
    return out;
  }

  function summary(m, c) {
    const found = problems(m, c);
    const out = { problems: found, world: world(c), dp: found.length ? null : dpOf(c) };
    if (found.length) return out;
    const f = flops(m, c);
    return Object.assign(out, {
      weights: weights(m, c), activations: activations(m, c), memory: memory(m, c), fits: memoryFits(m, c), flops: f,
      flops_per_gpu: f.value / world(c), bubble: bubble(c), padded_vocab: paddedVocab(m, c),
      communication: communication(m, c),
    });
  }

  // ------------------------------------------------------------------ the page
  const SIZE_KEYS = { hidden: "hidden", heads: "heads", groups: "query_groups", kvc: "kv_channels", ffn: "ffn",
    vocab: "vocab", layers: "layers", experts: "num_experts", moeffn: "moe_ffn", topk: "topk" };
  const DEFAULT = { model: "qwen3-8b", gpn: "8", nodes: "1", tp: "2", pp: "1", cp: "1", ep: "1", vp: "0",
    mbs: "1", m: "8", seq: "4096", sp: "1", rc: "selective", dopt: "1", fp32: "1", p2p: "1" };
  const GROUP_NAME = { tp: "TP", cp: "CP", pp: "PP", dp: "DP（×CP）", ep: "EP", edp: "expert-DP" };
  const $ = sel => root.querySelector(sel);
  const readHash = () => Object.fromEntries(new URLSearchParams(location.hash.replace(/^#/, "")));
  const int = v => (v === undefined || String(v).trim() === "" ? NaN : Number(v));

  const state = () => Object.assign({}, DEFAULT, readHash());

  // a hash the page cannot read is refused in one line (never silently replaced by a default)
  function unreadable(s) {
    if (!Object.prototype.hasOwnProperty.call(MODELS, s.model)) {
      return `unknown model ${repr(s.model)}: one of ${Object.keys(MODELS).join(", ")}`;
    }
    return null;
  }

  // the hash -> (model, config), as tests/site/test_calculator.py builds them in Python
  function parse(s) {
    const base = MODELS[Object.prototype.hasOwnProperty.call(MODELS, s.model) ? s.model : DEFAULT.model];
    const m = Object.assign({ name: s.model }, base);
    let changed = false;
    for (const [key, field] of Object.entries(SIZE_KEYS)) {
      if (s[key] === undefined) continue;
      let v = int(s[key]);
      if (field === "num_experts" && v === 0) v = null;
      if (v !== m[field]) { m[field] = v; changed = true; }
    }
    if (m.num_experts === null) { m.moe_ffn = null; m.topk = null; }
    if (changed) m.name = "custom";
    // vp: 0 (the menu's "不交错") and 1 are no interleaving -- Megatron-LM turns vp 1 into None
    // (arguments.py:917-918, 944-945), as formulas.Config does; anything else must be a positive int
    const vp = int(s.vp);
    const c = {
      gpus_per_node: int(s.gpn), nodes: int(s.nodes), tp: int(s.tp), pp: int(s.pp), cp: int(s.cp), ep: int(s.ep),
      vp: vp === 0 || vp === 1 ? null : vp, micro_batch_size: int(s.mbs), num_microbatches: int(s.m), seq: int(s.seq),
      sp: s.sp === "1", recompute: s.rc, distributed_optimizer: s.dopt === "1", grad_reduce_in_fp32: s.fp32 === "1",
      vocab_multiple: 128, overlap_p2p_comm: s.p2p !== "0",
    };
    return { m, c };
  }

  const UNITS = ["B", "KiB", "MiB", "GiB", "TiB"];
  function bytes(x) {
    let i = 0;
    while (i < UNITS.length - 1 && Math.abs(x) >= 1024) { x /= 1024; i++; }
    return `${x.toFixed(i ? 2 : 0)} ${UNITS[i]}`;
  }
  function flopText(x) {
    const units = [[1e18, "EFLOP"], [1e15, "PFLOP"], [1e12, "TFLOP"], [1e9, "GFLOP"], [1e6, "MFLOP"]];
    for (const [k, u] of units) if (x >= k) return `${(x / k).toFixed(3)} ${u}`;
    return `${x.toFixed(0)} FLOP`;
  }
  function seconds(x) { return x >= 1 ? `${x.toFixed(2)} s` : x >= 1e-3 ? `${(x * 1e3).toFixed(2)} ms` : `${(x * 1e6).toFixed(1)} µs`; }

  const cell = (key, fig, fmt) => (fig.value === null
    ? `<td class="ms-v" data-key="${key}" data-value="none">—</td><td class="ms-why" data-key="${key}">不给数：${esc(fig.why)}</td>`
    : `<td class="ms-v" data-key="${key}" data-value="${fig.value}">${fmt(fig.value)}</td><td class="ms-why" data-key="${key}">${fig.note ? "前提：" + esc(fig.note) : ""}</td>`);

  function controls(s, m) {
    const opts = (values, value) => values.map(([v, label]) =>
      `<option value="${esc(v)}"${String(v) === String(value) ? " selected" : ""}>${esc(label)}</option>`).join("");
    const known = Object.keys(MODELS).map(k => [k, k]);
    if (!Object.prototype.hasOwnProperty.call(MODELS, s.model)) known.push([s.model, `${s.model}（未知）`]);  // shown as refused
    $("[name=model]").innerHTML = opts(known, s.model);
    for (const [key, field] of Object.entries(SIZE_KEYS)) {
      const el = $(`[name=${key}]`);
      const v = field === "num_experts" ? (m.num_experts === null ? 0 : m.num_experts) : m[field];
      if (document.activeElement !== el) el.value = v === null || Number.isNaN(v) ? "" : String(v);
      if (key === "moeffn" || key === "topk") el.disabled = m.num_experts === null;
    }
    for (const key of ["gpn", "nodes", "tp", "pp", "cp", "ep", "mbs", "m", "seq"]) {
      const el = $(`[name=${key}]`);
      if (document.activeElement !== el) el.value = s[key];
    }
    const vps = [[0, "不交错"], [2, "2"], [3, "3"], [4, "4"], [5, "5"], [6, "6"], [8, "8"]];
    if (!vps.some(([v]) => String(v) === s.vp)) vps.push([s.vp, s.vp]);  // a hash's other value stays visible
    $("[name=vp]").innerHTML = opts(vps, s.vp);
    $("[name=rc]").innerHTML = opts([["none", "不重算"], ["selective", "selective"], ["full", "full"]], s.rc);
    if (m.name === "custom") $(".ms-sizes").open = true;  // edited sizes stay in view
    $("[name=sp]").checked = s.sp === "1";
    $("[name=dopt]").checked = s.dopt === "1";
    $("[name=fp32]").checked = s.fp32 === "1";
    $("[name=p2p]").checked = s.p2p !== "0";
  }

  function render() {
    const hash = location.hash;
    const s = state();
    const { m, c } = parse(s);
    controls(s, m);
    const bad = unreadable(s);
    const r = bad ? { problems: [bad], world: null, dp: null } : summary(m, c);
    $(".ms-arch").textContent = bad ? "" : [m.swiglu ? "SwiGLU" : "GELU", m.rmsnorm ? "RMSNorm" : "LayerNorm",
      m.qk_norm ? "QK norm" : null, m.bias ? "bias" : "无 bias", m.untied ? "输出层不共享 embedding" : null]
      .filter(Boolean).join("，");
    if (r.problems.length) {
      $(".ms-error").hidden = false;
      $(".ms-result").hidden = true;
      $(".ms-error").innerHTML = `<p><strong>这组设置跑不起来：</strong><span class="ms-problem">${esc(r.problems[0])}</span></p>`;
      $(".ms-dp").textContent = "";
      root.dataset.state = "error";
      root.dataset.shown = hash;
      window.msCalc.last = r;
      return;
    }
    $(".ms-error").hidden = true;
    $(".ms-result").hidden = false;
    $(".ms-dp").innerHTML = `world ${r.world} = TP ${c.tp} × PP ${c.pp} × CP ${c.cp} × DP <strong data-key="dp" data-value="${r.dp}">${r.dp}</strong>`
      + `；expert-DP ${edpOf(c)}；global batch ${globalBatch(c)}；vocab 补到 <span data-key="padded_vocab" data-value="${r.padded_vocab}">${r.padded_vocab}</span>`;
    const budget = `${(MEMORY_BUDGET / 2 ** 30).toFixed(0)} GiB`;
    const fitsText = r.fits.fits === null ? "未知" : r.fits.fits ? "放得下" : "放不下";
    const fitsWhy = r.fits.fits === null ? "没有显存数，不判断：" + esc(r.fits.why)
      : `上限 ${budget} = 80 GiB 的卡留 10% 余量（CUDA 上下文、NCCL 缓冲、碎片不在公式里）`;
    $(".ms-mem tbody").innerHTML = [
      ["weights", "权重 + 梯度 + 优化器状态"], ["activations", "激活（第一个 stage）"], ["memory", "合计"],
    ].map(([k, label]) => `<tr><th>${label}</th>${cell(k, r[k], bytes)}</tr>`).join("")
      + `<tr><th>放得下 ${budget} 吗</th><td class="ms-v" data-key="fits" data-value="${r.fits.fits === null ? "none" : r.fits.fits}">${fitsText}</td><td class="ms-why" data-key="fits">${fitsWhy}</td></tr>`;
    const gpuPeak = r.flops_per_gpu / HARDWARE.peak_bf16_flops;
    $(".ms-compute tbody").innerHTML = [
      `<tr><th>每步 FLOPs（全部 GPU）</th>${cell("flops", r.flops, flopText)}</tr>`,
      `<tr><th>每张 GPU 每步</th><td class="ms-v" data-key="flops_per_gpu" data-value="${r.flops_per_gpu}">${flopText(r.flops_per_gpu)}</td><td class="ms-why">989 TFLOPS 跑满也要 ${seconds(gpuPeak)}</td></tr>`,
      `<tr><th>pipeline 气泡</th><td class="ms-v" data-key="bubble" data-value="${r.bubble}">${(100 * r.bubble).toFixed(1)}%</td><td class="ms-why">(p−1)/(v·m+p−1) = (${c.pp}−1)/(${c.vp || 1}·${c.num_microbatches}+${c.pp}−1)</td></tr>`,
    ].join("");
    $(".ms-comm tbody").innerHTML = GROUPS.map(g => {
      const row = r.communication[g];
      const link = row.link || "—";
      const v = row.bytes === null
        ? `<td class="ms-v" data-key="bytes" data-value="none">—</td><td data-key="seconds" data-value="none">—</td><td class="ms-why">不给数：${esc(row.why)}</td>`
        : `<td class="ms-v" data-key="bytes" data-value="${row.bytes}">${row.size > 1 ? bytes(row.bytes) : "—"}</td>`
          + `<td data-key="seconds" data-value="${row.seconds}">${row.size > 1 ? seconds(row.seconds) : "—"}</td>`
          + `<td class="ms-why">${row.size > 1 ? esc(row.basis) : ""}</td>`;
      return `<tr data-group="${g}"><th>${GROUP_NAME[g]}</th><td data-key="size">${row.size}</td><td data-key="link">${link}</td>${v}</tr>`;
    }).join("");
    root.dataset.state = "ok";
    root.dataset.shown = hash;
    window.msCalc.last = r;
  }

  function write(s) {
    const h = "#" + new URLSearchParams(s).toString();
    if (location.hash !== h) location.hash = h;
    else render();
  }

  root.addEventListener("change", e => {
    const name = e.target.name;
    if (!name) return;
    let s = state();
    if (name === "model") {
      s = Object.fromEntries(Object.entries(s).filter(([k]) => !(k in SIZE_KEYS)));
      s.model = e.target.value;
    } else if (e.target.type === "checkbox") s[name] = e.target.checked ? "1" : "0";
    else s[name] = e.target.value;
    write(s);
  });
  window.addEventListener("hashchange", render);
  window.msCalc = { MODELS, HARDWARE, MEMORY_BUDGET, MAX_SIZE, MAX_LAYERS, summary, problems, parse, gfmt, last: null };
  render();
})();
