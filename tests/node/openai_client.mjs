// Drives a running edgeserve with the official OpenAI Node client, unchanged, and checks what a
// client application relies on. Usage: node openai_client.mjs BASE_URL API_KEY MODEL
// (NODE_EXTRA_CA_CERTS names the server's certificate). Exit 0 when every check passes.
import OpenAI from 'openai';
import { standardResponseFormat } from 'openai/helpers/standard-schema';
import Ajv from 'ajv';
import { z } from 'zod';
import assert from 'node:assert/strict';

const [baseURL, apiKey, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60_000 });
let checks = 0;
const check = async (name, fn) => {
    await fn();
    checks++;
    console.log(`ok ${checks} - ${name}`);
};

await check('models.list names the served model', async () => {
    const ids = [];
    for await (const m of client.models.list()) ids.push(m.id);
    assert.ok(ids.includes(model), `models: ${ids}`);
});

await check('chat completion, greedy, with usage', async () => {
    const r = await client.chat.completions.create({
        model, messages: [{ role: 'user', content: 'Tell me a fortune' }],
        max_tokens: 16, temperature: 0,
    });
    assert.equal(r.object, 'chat.completion');
    assert.equal(r.choices[0].message.role, 'assistant');
    assert.ok(r.choices[0].message.content.length > 0);
    assert.ok(['length', 'stop'].includes(r.choices[0].finish_reason));
    assert.equal(r.usage.prompt_tokens, 17);  // The fixture's ChatML prompt C.
    assert.ok(r.usage.completion_tokens > 0 && r.usage.completion_tokens <= 16);
    assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
});

await check('greedy output is reproducible and streaming gives the same text', async () => {
    const req = { model, messages: [{ role: 'user', content: 'Tell me a fortune' }],
                  max_tokens: 24, temperature: 0 };
    const a = await client.chat.completions.create(req);
    const stream = await client.chat.completions.create({
        ...req, stream: true, stream_options: { include_usage: true } });
    let text = '';
    let usage = null;
    let finish = null;
    for await (const chunk of stream) {
        if (chunk.usage) usage = chunk.usage;
        for (const c of chunk.choices) {
            text += c.delta?.content ?? '';
            if (c.finish_reason) finish = c.finish_reason;
        }
    }
    assert.equal(text, a.choices[0].message.content);
    assert.equal(finish, a.choices[0].finish_reason);
    assert.deepEqual(usage.completion_tokens, a.usage.completion_tokens);
});

await check('continuous_usage_stats: each chunk has its choice\'s usage so far', async () => {
    const stream_options = { include_usage: true, continuous_usage_stats: true };
    const chat = await client.chat.completions.create({
        model, messages: [{ role: 'user', content: 'Tell me a fortune' }], max_tokens: 8,
        temperature: 0.8, seed: 7, n: 2, stream: true, stream_options });
    const legacy = await client.completions.create({
        model, prompt: ['It is a', 'Tell me a fortune'], max_tokens: 8, temperature: 0,
        stream: true, stream_options });
    for (const stream of [chat, legacy]) {
        const latest = new Map();  // Choice index -> the usage of its latest chunk.
        let final = null;
        for await (const chunk of stream) {
            if (chunk.choices.length === 0) {
                final = chunk.usage;
                continue;
            }
            const u = chunk.usage;
            assert.ok(u, 'a chunk with a choice carries usage');
            assert.equal(u.total_tokens, u.prompt_tokens + u.completion_tokens);
            const before = latest.get(chunk.choices[0].index);
            if (before) {
                assert.equal(u.prompt_tokens, before.prompt_tokens);
                assert.ok(u.completion_tokens >= before.completion_tokens);
            }
            latest.set(chunk.choices[0].index, u);
        }
        assert.equal(latest.size, 2);
        const choices = [...latest.values()];
        // Each choice's last chunk has its whole count; the final chunk sums them, and the
        // prompts (chat: one prompt, counted once; completions: each of the list).
        assert.equal(final.completion_tokens,
                     choices.reduce((sum, u) => sum + u.completion_tokens, 0));
        assert.equal(final.prompt_tokens, stream === chat
            ? choices[0].prompt_tokens : choices.reduce((sum, u) => sum + u.prompt_tokens, 0));
    }
});

await check('legacy completions with a seed are reproducible', async () => {
    const req = { model, prompt: 'It is a', max_tokens: 12, temperature: 0.8, seed: 42 };
    const a = await client.completions.create(req);
    const b = await client.completions.create(req);
    assert.equal(a.choices[0].text, b.choices[0].text);
    assert.equal(a.usage.prompt_tokens, 3);
});

await check('logprobs come back for each token', async () => {
    const r = await client.chat.completions.create({
        model, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 4, temperature: 0,
        logprobs: true, top_logprobs: 3 });
    const lp = r.choices[0].logprobs.content;
    assert.equal(lp.length, r.usage.completion_tokens);
    for (const t of lp) {
        assert.ok(t.logprob <= 0);
        assert.equal(t.top_logprobs.length, 3);
        assert.ok(t.top_logprobs[0].logprob >= t.top_logprobs[2].logprob);
    }
});

const fortuneTools = [{
    type: 'function',
    function: { name: 'get_fortune', description: 'A fortune on a topic.',
                parameters: { type: 'object', properties: { topic: { type: 'string' } } } },
}];

await check('tools: a named tool_choice streams OpenAI tool_calls deltas', async () => {
    // The fixture never learned tools: the forced call's header comes from the server, and the
    // call is held (its arguments any JSON object, the tool not being strict), so it is a call,
    // cut by max_tokens or whole, never malformed_tool_call.
    const stream = await client.chat.completions.create({
        model, messages: [{ role: 'user', content: 'Tell me a fortune' }], tools: fortuneTools,
        tool_choice: { type: 'function', function: { name: 'get_fortune' } },
        max_tokens: 24, temperature: 0, stream: true });
    let name = null;
    let id = null;
    let finish = null;
    let content = '';
    for await (const chunk of stream) {
        for (const c of chunk.choices) {
            content += c.delta?.content ?? '';
            for (const tc of c.delta?.tool_calls ?? []) {
                assert.equal(tc.index, 0);
                if (tc.function?.name) {
                    assert.equal(name, null, 'one header per call');
                    name = tc.function.name;
                    id = tc.id;
                    assert.equal(tc.type, 'function');
                }
            }
            if (c.finish_reason) finish = c.finish_reason;
        }
    }
    assert.ok(['tool_calls', 'length'].includes(finish), finish);
    assert.equal(name, 'get_fortune', content);
    assert.ok(id.startsWith('call_'), id);
});

await check('tools: auto, non-streaming, parsed by the client', async () => {
    const r = await client.chat.completions.create({
        model, messages: [{ role: 'user', content: 'Tell me a fortune' }], tools: fortuneTools,
        tool_choice: 'auto', max_tokens: 16, temperature: 0 });
    assert.equal(r.choices[0].message.role, 'assistant');
    assert.ok(['stop', 'length', 'tool_calls', 'malformed_tool_call']
        .includes(r.choices[0].finish_reason));
});

await check('tools: tool_choice naming an unknown function is a BadRequestError', async () => {
    await assert.rejects(
        client.chat.completions.create({ model, messages: [{ role: 'user', content: 'x' }],
            tools: fortuneTools, tool_choice: { type: 'function', function: { name: 'nope' } } }),
        (e) => e instanceof OpenAI.BadRequestError && e.param === 'tool_choice.function.name');
});

await check('n: choices by index, choice i as a single request seeded seed + i', async () => {
    const req = { model, messages: [{ role: 'user', content: 'Tell me a fortune' }],
                  max_tokens: 12, temperature: 1.0, seed: 7 };
    const r = await client.chat.completions.create({ ...req, n: 3 });
    assert.equal(r.choices.length, 3);
    r.choices.forEach((c, i) => assert.equal(c.index, i));
    let completion = 0;
    for (let i = 0; i < 3; i++) {
        const one = await client.chat.completions.create({ ...req, seed: 7 + i });
        assert.equal(r.choices[i].message.content, one.choices[0].message.content);
        completion += one.usage.completion_tokens;
        assert.equal(r.usage.prompt_tokens, one.usage.prompt_tokens);
    }
    assert.equal(r.usage.completion_tokens, completion);
    // Streamed, the chunks of each index add up to the same texts.
    const stream = await client.chat.completions.create({ ...req, n: 3, stream: true });
    const texts = ['', '', ''];
    for await (const chunk of stream) {
        for (const c of chunk.choices) texts[c.index] += c.delta?.content ?? '';
    }
    assert.deepEqual(texts, r.choices.map((c) => c.message.content));
});

await check("vLLM's min_tokens holds the end off, min_p and repetition_penalty are taken", async () => {
    const req = { model, messages: [{ role: 'user', content: 'Tell me a fortune' }],
                  temperature: 0, max_tokens: 200 };
    const free = await client.chat.completions.create(req);
    assert.equal(free.choices[0].finish_reason, 'stop');
    const ended = free.usage.completion_tokens;
    const held = await client.chat.completions.create({ ...req, min_tokens: ended + 4 });
    assert.ok(held.usage.completion_tokens >= ended + 4,
              `${held.usage.completion_tokens} < ${ended + 4}`);
    const tuned = await client.chat.completions.create({
        ...req, temperature: 0.8, seed: 3, min_p: 0.1, repetition_penalty: 1.3, max_tokens: 16 });
    assert.ok(tuned.choices[0].message.content.length > 0);
});

await check('echo: the prompt, its logprobs (the first null), then the completion', async () => {
    // How evaluation harnesses score a text's likelihood (lm-evaluation-harness loglikelihood).
    const prompt = 'It is a fortune';
    const r = await client.completions.create({
        model, prompt, echo: true, logprobs: 2, max_tokens: 3, temperature: 0 });
    const c = r.choices[0];
    assert.ok(c.text.startsWith(prompt), c.text);
    const lp = c.logprobs;
    assert.equal(lp.tokens.length, r.usage.prompt_tokens + r.usage.completion_tokens);
    assert.equal(lp.tokens.slice(0, r.usage.prompt_tokens).join(''), prompt);
    assert.equal(lp.token_logprobs[0], null);
    assert.equal(lp.top_logprobs[0], null);
    for (let i = 1; i < lp.tokens.length; i++) {
        assert.ok(lp.token_logprobs[i] <= 0);
        assert.ok(Object.keys(lp.top_logprobs[i]).length >= 2);
    }
    assert.equal(lp.text_offset[0], 0);
    assert.equal(lp.text_offset[r.usage.prompt_tokens], prompt.length);
    // The completion after the echo is the one without it.
    const plain = await client.completions.create({ model, prompt, max_tokens: 3, temperature: 0 });
    assert.equal(c.text, prompt + plain.choices[0].text);
    // Streamed, the prompt is the first text.
    const stream = await client.completions.create({
        model, prompt, echo: true, max_tokens: 3, temperature: 0, stream: true });
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.text ?? '';
    assert.equal(text, c.text);
});

await check('response_format json_object: the reply is a JSON object', async () => {
    for (const temperature of [0, 1.0]) {
        const r = await client.chat.completions.create({
            model, messages: [{ role: 'user', content: 'Tell me a fortune as JSON' }],
            response_format: { type: 'json_object' }, max_tokens: 200, temperature, seed: 11 });
        const c = r.choices[0];
        assert.ok(c.message.content.trimStart().startsWith('{'), c.message.content);
        if (c.finish_reason === 'stop') {
            const parsed = JSON.parse(c.message.content);
            assert.equal(typeof parsed, 'object');
            assert.ok(!Array.isArray(parsed) && parsed !== null);
        } else {
            assert.equal(c.finish_reason, 'length');
        }
    }
});

// A schema with most of what structured outputs use: bounded strings, arrays and numbers, an enum,
// a nullable field, a nested object behind a $ref. Ajv (not ours) says whether replies are valid.
const fortuneSchema = {
    $defs: {
        omen: { type: 'object', properties: { sign: { enum: ['crow', 'comet', 'cat'] },
                                              strength: { type: 'integer', minimum: 1, maximum: 5 } },
                required: ['sign', 'strength'], additionalProperties: false },
    },
    type: 'object',
    properties: {
        fortune: { type: 'string', minLength: 1, maxLength: 60 },
        lucky_numbers: { type: 'array', items: { type: 'integer', minimum: 1, maximum: 99 },
                         minItems: 1, maxItems: 3 },
        mood: { enum: ['good', 'bad', 'mixed'] },
        confidence: { type: 'number', minimum: 0, maximum: 1 },
        omen: { anyOf: [{ $ref: '#/$defs/omen' }, { type: 'null' }] },
    },
    required: ['fortune', 'lucky_numbers', 'mood', 'confidence', 'omen'],
    additionalProperties: false,
};

await check('response_format json_schema: replies are valid under the schema (by Ajv)', async () => {
    const validate = new Ajv({ strict: false }).compile(fortuneSchema);
    for (const [temperature, stream] of [[0, false], [1.0, false], [0.8, true]]) {
        const req = { model, messages: [{ role: 'user', content: 'Tell me a fortune as JSON' }],
                      response_format: { type: 'json_schema',
                                         json_schema: { name: 'fortune', strict: true,
                                                        schema: fortuneSchema } },
                      max_tokens: 400, temperature, seed: 5 };
        let content = '';
        let finish = null;
        if (stream) {
            for await (const chunk of await client.chat.completions.create({ ...req, stream })) {
                content += chunk.choices[0]?.delta?.content ?? '';
                finish = chunk.choices[0]?.finish_reason ?? finish;
            }
        } else {
            const r = await client.chat.completions.create(req);
            content = r.choices[0].message.content;
            finish = r.choices[0].finish_reason;
        }
        assert.equal(finish, 'stop', content);
        const parsed = JSON.parse(content);
        assert.ok(validate(parsed), `${JSON.stringify(validate.errors)} in ${content}`);
    }
});

await check('chat.completions.parse with a Zod schema: message.parsed is the object', async () => {
    // A discriminated union: its objects begin alike, and the "kind" tells them apart.
    const Fortune = z.object({
        fortune: z.string().max(40),
        lucky: z.array(z.number().int().min(1).max(9)).max(3),
        mood: z.enum(['good', 'bad']),
        note: z.string().max(10).nullable(),
        omen: z.discriminatedUnion('kind', [
            z.object({ kind: z.literal('crow'), count: z.number().int().min(1).max(3) }),
            z.object({ kind: z.literal('comet'), color: z.enum(['red', 'blue']) }),
        ]),
    });
    const r = await client.chat.completions.parse({
        model, messages: [{ role: 'user', content: 'Tell me a fortune' }],
        response_format: standardResponseFormat(Fortune, 'fortune'), max_tokens: 300,
        temperature: 0 });
    const c = r.choices[0];
    assert.equal(c.finish_reason, 'stop', c.message.content);
    assert.deepEqual(Fortune.parse(c.message.parsed), c.message.parsed);
});

await check('a schema that cannot be followed is a BadRequestError saying what and where', async () => {
    await assert.rejects(
        client.chat.completions.create({
            model, messages: [{ role: 'user', content: 'x' }],
            response_format: { type: 'json_schema', json_schema: { name: 'p', schema: {
                type: 'object', properties: { code: { type: 'string', pattern: '^[A-Z]+$' } } } } } }),
        (e) => e instanceof OpenAI.BadRequestError && e.param === 'response_format' &&
               e.message.includes("schema at '#/properties/code': 'pattern' is not supported"));
});

await check('tools: a call forced to strict tools has arguments valid under their parameters (Ajv)', async () => {
    // The fixture never learned tools; held to the parameters, its one call parses and is valid.
    const parameters = {
        type: 'object',
        properties: {
            topic: { type: 'string', maxLength: 30 },
            count: { type: 'integer', minimum: 1, maximum: 3 },
            tone: { enum: ['warm', 'dry'] },
        },
        required: ['topic', 'count', 'tone'],
        additionalProperties: false,
    };
    const jokeParameters = {
        type: 'object', properties: { subject: { type: ['string', 'null'] } },
        required: ['subject'], additionalProperties: false,
    };
    const ajv = new Ajv({ strict: false });
    const validators = { get_fortune: ajv.compile(parameters), get_joke: ajv.compile(jokeParameters) };
    const tools = [
        { type: 'function', function: { name: 'get_fortune', strict: true, parameters } },
        { type: 'function', function: { name: 'get_joke', strict: true, parameters: jokeParameters } },
    ];
    const named = { type: 'function', function: { name: 'get_fortune' } };
    const loose = tools.map((t) => ({ ...t, function: { ...t.function, strict: false } }));
    // Named: that tool's parameters; "required": the model names either, then follows its own
    // (parallel_tool_calls false: one call, then the reply ends; this model, which never learned
    // tools, would otherwise ramble on after it). Without strict tools, parallel_tool_calls false
    // still holds the reply to one call, its arguments any JSON object.
    for (const [stream, toolChoice, seed, strict] of [[false, named, 3, true], [true, named, 4, true],
                                                      [false, 'required', 5, true],
                                                      [true, 'required', 6, true],
                                                      [false, 'required', 7, false]]) {
        const req = { model, messages: [{ role: 'user', content: 'Tell me a fortune' }],
                      tools: strict ? tools : loose, tool_choice: toolChoice,
                      parallel_tool_calls: toolChoice === named,
                      // response_format shapes content; a forced call has none.
                      response_format: { type: 'json_object' },
                      max_tokens: 200, temperature: 0.7, seed };
        let args = '';
        let name = null;
        let finish = null;
        if (stream) {
            for await (const chunk of await client.chat.completions.create({ ...req, stream })) {
                const c = chunk.choices[0];
                for (const tc of c?.delta?.tool_calls ?? []) {
                    name = tc.function?.name ?? name;
                    args += tc.function?.arguments ?? '';
                }
                finish = c?.finish_reason ?? finish;
            }
        } else {
            const r = await client.chat.completions.create(req);
            const calls = r.choices[0].message.tool_calls;
            assert.equal(calls.length, 1);
            name = calls[0].function.name;
            args = calls[0].function.arguments;
            finish = r.choices[0].finish_reason;
        }
        assert.equal(finish, 'tool_calls', args);
        if (toolChoice === named) assert.equal(name, 'get_fortune');
        const validate = validators[name];
        assert.ok(validate, name);
        const parsed = JSON.parse(args);
        if (strict) {
            assert.ok(validate(parsed), `${JSON.stringify(validate.errors)} in ${args}`);
        } else {
            assert.ok(typeof parsed === 'object' && parsed !== null && !Array.isArray(parsed), args);
        }
    }
    await assert.rejects(
        client.chat.completions.create({
            model, messages: [{ role: 'user', content: 'x' }],
            tools: [{ type: 'function', function: { name: 'f', strict: true, parameters: {
                type: 'object', properties: { n: { type: 'number', multipleOf: 2 } } } } }] }),
        (e) => e instanceof OpenAI.BadRequestError && e.param === 'tools[0].function.parameters' &&
               e.message.includes('multipleOf'));
});

await check('unknown model is a NotFoundError', async () => {
    await assert.rejects(
        client.chat.completions.create({ model: 'no-such-model',
                                         messages: [{ role: 'user', content: 'x' }] }),
        (e) => e instanceof OpenAI.NotFoundError && e.code === 'model_not_found');
});

await check('a refused stream is a NotFoundError too, not an error inside a 200 stream', async () => {
    await assert.rejects(
        client.chat.completions.create({ model: 'no-such-model', stream: true,
                                         messages: [{ role: 'user', content: 'x' }] }),
        (e) => e instanceof OpenAI.NotFoundError && e.code === 'model_not_found');
});

await check('models.retrieve by id', async () => {
    const m = await client.models.retrieve(model);
    assert.equal(m.id, model);
    await assert.rejects(client.models.retrieve('no-such-model'),
        (e) => e instanceof OpenAI.NotFoundError);
});

await check('without max_tokens the reply runs to a stop within the context', async () => {
    const r = await client.chat.completions.create({
        model, messages: [{ role: 'user', content: 'Tell me my fortune' }], temperature: 0 });
    assert.ok(r.choices[0].message.content.length > 0);
    assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
});

await check('a prompt beyond the context is context_length_exceeded', async () => {
    await assert.rejects(
        client.chat.completions.create({ model, max_tokens: 4,
            messages: [{ role: 'user', content: 'fortune '.repeat(3000) }] }),
        (e) => e instanceof OpenAI.BadRequestError && e.code === 'context_length_exceeded' &&
               e.param === 'messages');
});

await check('bad parameter is a BadRequestError naming the param', async () => {
    await assert.rejects(
        client.chat.completions.create({ model, messages: [{ role: 'user', content: 'x' }],
                                         temperature: 7 }),
        (e) => e instanceof OpenAI.BadRequestError && e.param === 'temperature');
});

await check('wrong key is an AuthenticationError', async () => {
    const other = new OpenAI({ baseURL, apiKey: 'sk-wrong', maxRetries: 0 });
    await assert.rejects(other.models.list(), (e) => e instanceof OpenAI.AuthenticationError);
});

console.log(`${checks} passed, 0 failed`);
