// Holds a token shard written by `mxtrain prepare --tokenizer DIR --fortune --val-fraction 0
// CORPUS` to Hugging Face tokenizers' own encoding (the Rust library through its Node
// binding, the npm package `tokenizers`) of the same documents with the same
// tokenizer.json: for each document, the EOS of DIR/tokenizer_config.json, then
// encode(document, addSpecialTokens = true). Documents are split as prepare's --fortune
// does: at lines that are exactly "%" (or "%\r"), blank ones left out.
// usage: node compare.js NODE_MODULES DIR CORPUS SHARD
'use strict';
const fs = require('fs');
const path = require('path');
const [modules, dir, corpusPath, shardPath] = process.argv.slice(2);
const { Tokenizer } = require(path.join(modules, 'tokenizers'));

function documents(text) {
    const docs = [];
    let start = 0, line = 0;
    while (line < text.length) {
        const nl = text.indexOf('\n', line);
        const end = nl < 0 ? text.length : nl, next = nl < 0 ? text.length : nl + 1;
        const l = text.slice(line, end);
        if (l === '%' || l === '%\r') { docs.push(text.slice(start, line)); start = next; }
        line = next;
    }
    if (start < text.length) docs.push(text.slice(start));
    return docs.filter((d) => !/^[ \t\n\r\f\v]*$/.test(d));
}

function shard(p) {
    const b = fs.readFileSync(p);
    const magic = b.readInt32LE(0), version = b.readInt32LE(4), count = b.readInt32LE(8);
    if (!(magic === 20240520 && version === 1) && !(magic === 20240801 && version === 7)) throw new Error(`${p}: not an llm.c shard`);
    const width = version === 7 ? 4 : 2, ids = [];
    for (let i = 0; i < count; i++) ids.push(width === 4 ? b.readUInt32LE(1024 + 4 * i) : b.readUInt16LE(1024 + 2 * i));
    return { width, ids };
}

(async () => {
    const tok = Tokenizer.fromFile(path.join(dir, 'tokenizer.json'));
    const config = JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer_config.json'), 'utf8'));
    const eosText = typeof config.eos_token === 'string' ? config.eos_token : config.eos_token.content;
    const eos = tok.tokenToId(eosText);
    const docs = documents(fs.readFileSync(corpusPath, 'utf8'));
    const got = shard(shardPath);
    let at = 0, bad = 0;
    for (let d = 0; d < docs.length; d++) {
        const enc = await tok.encode(docs[d], null, { addSpecialTokens: true });
        const want = [eos, ...enc.getIds()];
        const have = got.ids.slice(at, at + want.length);
        at += want.length;
        const k = want.findIndex((v, i) => v !== have[i]);
        if (k >= 0 && bad++ < 3) {
            console.log(`  document ${d}: first difference at token ${k}: Hugging Face ${want.slice(k, k + 8)}, ` +
                        `mxtrain ${have.slice(k, k + 8)}`);
            console.log(`    Hugging Face tokens there: ${JSON.stringify(enc.getTokens().slice(Math.max(0, k - 3), k + 5))}`);
            at = got.ids.length + 1; // the rest is misaligned
            break;
        }
    }
    if (!bad && at !== got.ids.length) { console.log(`  ${got.ids.length} tokens in the shard, ${at} expected`); bad++; }
    const vocab = tok.getVocabSize(true);
    if (!bad && got.width !== (vocab > 65536 ? 4 : 2)) { console.log(`  ${got.width}-byte tokens for vocabulary ${vocab}`); bad++; }
    if (bad) process.exit(1);
    console.log(`  ${docs.length} documents, ${at} tokens (EOS ${eos} '${eosText}', uint${8 * got.width}): identical`);
})().catch((e) => { console.log(`  ${e.stack}`); process.exit(1); });
