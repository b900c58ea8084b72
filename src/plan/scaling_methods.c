/* One budget or model size through five ways of choosing N and D (nanolm/scaling_methods.h). */
#include <math.h>

#include "nanolm/scaling_methods.h"

void nl_scaling_methods(double flops, double params, nl_scaling_choice r[NL_SCALING_METHODS]) {
    nl_chinchilla law, rounded;
    nl_scaling_hoffmann(&law);
    nl_scaling_hoffmann_rounded(&rounded);
    nl_powerlaw a1n, a1d;
    nl_scaling_approach1(&a1n, &a1d);
    if (flops > 0) {
        double n, d;
        nl_scaling_rule(20, flops, &n, &d);
        r[0] = (nl_scaling_choice){"20 tokens/param", n, d, flops, 0};
        n = a1n.k * pow(flops, a1n.a);
        r[1] = (nl_scaling_choice){"Chinchilla approach 1", n, flops / (6 * n), flops, 0};
        nl_scaling_optimal_law(&law, flops, &n, &d);
        r[2] = (nl_scaling_choice){"Chinchilla approach 3", n, d, flops, 0};
        nl_scaling_optimal_law(&rounded, flops, &n, &d);
        r[3] = (nl_scaling_choice){"approach 3, rounded consts", n, d, flops, 0};
        n = nl_scaling_kaplan_params(flops);
        r[4] = (nl_scaling_choice){"Kaplan 2020 (N ~ C^0.73)", n, flops / (6 * n), flops, 0};
    } else {
        double n = params;
        r[0] = (nl_scaling_choice){"20 tokens/param", n, 20 * n, 6 * n * 20 * n, 0};
        double c1 = pow(n / a1n.k, 1 / a1n.a);
        r[1] = (nl_scaling_choice){"Chinchilla approach 1", n, c1 / (6 * n), c1, 0};
        double c3 = nl_scaling_flops_for_params(&law, n);
        r[2] = (nl_scaling_choice){"Chinchilla approach 3", n, c3 / (6 * n), c3, 0};
        double cr = nl_scaling_flops_for_params(&rounded, n);
        r[3] = (nl_scaling_choice){"approach 3, rounded consts", n, cr / (6 * n), cr, 0};
        double ck = 8.64e19 * pow(n / 1.3e9, 1 / 0.73);
        r[4] = (nl_scaling_choice){"Kaplan 2020 (N ~ C^0.73)", n, ck / (6 * n), ck, 0};
    }
    for (int i = 0; i < 5; i++) r[i].loss = nl_scaling_loss(&law, r[i].n, r[i].d);
}
