/* libFuzzer target: chat template text (a model file's "chat_template") through the Jinja
 * parser, then rendered for a fixed conversation with the marks of where each byte came from.
 * Invariants: a refusal has a message that names the template; an accepted render has one mark
 * per byte, each 0 or 1, and a runaway template stops at the step budget instead of hanging. */
#include <stdlib.h>
#include <string.h>

#include "nanolm/base.h"
#include "nanolm/chat_template.h"

#include "fuzz_targets.h"

int nl_fuzz_chat_template(const uint8_t *data, size_t size) {
    nl_chat_template *t = NULL;
    if (nl_chat_template_parse(&t, (const char *)data, size, "fuzz") != NL_OK) {
        if (!strstr(nl_last_error(), "chat template fuzz")) abort();
        return 0;
    }
    if (nl_chat_template_set_tokens(t, "<s>", "</s>") != NL_OK) abort();
    static const nl_chat_message msgs[] = {
        {"system", "Be brief."}, {"user", "Hi </s> {{ x }} \xc3\xa9"}, {"assistant", "  ok  "}, {"user", ""}};
    char *out = NULL;
    unsigned char *marks = NULL;
    size_t n = 0;
    if (nl_chat_template_apply_marked(t, msgs, 4, 1, &out, &n, &marks) == NL_OK) {
        if (!out || !marks || strlen(out) > n) abort();
        for (size_t i = 0; i < n; i++)
            if (marks[i] > 1) abort();
    } else if (!strstr(nl_last_error(), "chat template fuzz")) {
        abort();
    }
    free(out);
    free(marks);
    nl_chat_template_free(t);
    return 0;
}

#ifndef NL_FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return nl_fuzz_chat_template(data, size); }
#endif
