/*
 * Chat templates: the Jinja programs Hugging Face models ship (tokenizer_config.json's
 * "chat_template", or chat_template.jinja) that turn a conversation into the model's prompt.
 *
 * A Jinja subset, rendered as transformers' apply_chat_template renders it (Jinja2 with
 * trim_blocks and lstrip_blocks, loop controls, tojson as json.dumps with ensure_ascii=False,
 * the globals raise_exception and strftime_now, and the variables messages, tools = none,
 * documents = none, add_generation_prompt, bos_token and eos_token):
 *
 * - tags: {{ }}, {% %}, {# #}, whitespace control {%- -%} {{- -}} {%+ %}; statements if / elif /
 *   else, for (loop.index0, index, first, last, length, revindex, revindex0, previtem,
 *   nextitem; `for k, v in d.items() if cond`; for-else), set (names, `ns.attr` of a
 *   namespace(), `{% set x %}...{% endset %}`), break, continue, generation (transparent);
 *   a set inside a for loop stays in the loop, as in Jinja.
 * - expressions: literals (strings with Python escapes, ints, floats, true/false/none, lists,
 *   dicts, tuples), names, .attr, [item], slices [a:b:c], calls with keyword arguments,
 *   + - * / // % ** ~, comparisons, in / not in, and / or / not, `a if c else b`, tests
 *   (is defined, none, string, mapping, iterable, sequence, number, integer, boolean, true,
 *   false, even, odd, divisibleby, equalto, eq, ne, lower, upper, in), filters (trim, length,
 *   count, default / d, tojson, string, lower, upper, capitalize, title, first, last, list,
 *   join, replace, selectattr, rejectattr, select, reject, map, items, int, float, abs,
 *   reverse, unique, safe), string methods (strip, lstrip, rstrip, startswith, endswith,
 *   split, upper, lower, title, capitalize, replace, find, format-free), dict methods (items,
 *   keys, values, get), globals raise_exception, strftime_now, namespace, range, dict.
 * - values follow Python: none prints "None", true "True"; + on a string and a number is an
 *   error; an undefined value prints nothing and is false, and reading an attribute of one is an
 *   error (as Jinja's default Undefined).
 *
 * Errors (NL_ERR_FORMAT when parsing, NL_ERR_INVALID when rendering) name the template (`what`)
 * and the line and column: "chat template X line 3 col 7: unknown filter 'foo'";
 * raise_exception("msg") fails with "... raise_exception: msg". A render stops with an error past
 * 2,000,000 statements or loop iterations, 64 MiB of output or 256 MiB of working memory (a
 * runaway template cannot hang the server).
 */
#ifndef NANOLM_CHAT_TEMPLATE_H
#define NANOLM_CHAT_TEMPLATE_H

#include <stddef.h>

#include "nanolm/base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nl_chat_template nl_chat_template;

/* One message of a conversation (role "system", "user", "assistant", ...). */
typedef struct nl_chat_message {
    const char *role;
    const char *content;
} nl_chat_message;

/* Parses template text (`what` names it in messages). Errors: NL_ERR_FORMAT naming the line and
 * column (an unclosed tag or block, an unknown statement, a syntax error), NL_ERR_NOMEM. */
nl_status nl_chat_template_parse(nl_chat_template **out, const char *source, size_t bytes, const char *what);
void nl_chat_template_free(nl_chat_template *t);

/* The special-token strings the template sees as bos_token / eos_token (NULL: none). */
nl_status nl_chat_template_set_tokens(nl_chat_template *t, const char *bos_token, const char *eos_token);
const char *nl_chat_template_bos(const nl_chat_template *t);
const char *nl_chat_template_eos(const nl_chat_template *t);

/* Renders with the variables of a JSON object (vars_json: e.g. {"messages": [...],
 * "add_generation_prompt": true, "date_string": "26 Jul 2024"}); bos_token, eos_token, tools and
 * documents are added as apply_chat_template adds them unless the object has them. *out is
 * NUL-terminated (free with nl_free). Errors: NL_ERR_INVALID (vars not a JSON object, or a
 * render error naming the line), NL_ERR_NOMEM. */
nl_status nl_chat_template_render_json(const nl_chat_template *t, const char *vars_json, size_t vars_bytes, char **out,
                                       size_t *out_bytes);

/* Renders a conversation as apply_chat_template(messages, add_generation_prompt, tokenize=False). */
nl_status nl_chat_template_apply(const nl_chat_template *t, const nl_chat_message *messages, int n_messages,
                                 int add_generation_prompt, char **out, size_t *out_bytes);

/* As nl_chat_template_apply, and *from_data (free with free(); out_bytes bytes) marks each byte
 * of the text: 1 where it came from the messages (data), 0 where the template wrote it. A
 * special token may then be matched only where the template wrote it (nl_tokenizer_encode_marked):
 * "<|im_end|>" typed by a user stays text. Through concatenation, trim, slices and split the
 * marks follow the bytes; other transformations of data (replace, upper, tojson) mark their whole
 * result as data. */
nl_status nl_chat_template_apply_marked(const nl_chat_template *t, const nl_chat_message *messages, int n_messages,
                                        int add_generation_prompt, char **out, size_t *out_bytes,
                                        unsigned char **from_data);

/* Loads the chat template of a Hugging Face folder: DIR/chat_template.jinja when present, else
 * tokenizer_config.json's "chat_template" (a string, or a list of {"name", "template"} from which
 * "default" is taken), with bos_token / eos_token from tokenizer_config.json (a string or an
 * {"content": ...} object). Errors: NL_ERR_UNSUPPORTED "DIR has no chat template
 * (...)" when neither file has one, NL_ERR_FORMAT naming the file, NL_ERR_IO. */
nl_status nl_chat_template_load_hf(nl_chat_template **out, const char *dir);

/* Loads the chat template of a GGUF file: the string KV tokenizer.chat_template, with bos_token /
 * eos_token the entries of tokenizer.ggml.tokens at tokenizer.ggml.bos_token_id / eos_token_id.
 * Errors: NL_ERR_UNSUPPORTED "PATH has no chat template (no tokenizer.chat_template)",
 * NL_ERR_FORMAT naming the file and the key, NL_ERR_IO. */
nl_status nl_chat_template_load_gguf(nl_chat_template **out, const char *path);

#ifdef __cplusplus
}
#endif
#endif
