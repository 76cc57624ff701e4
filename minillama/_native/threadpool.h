/* threadpool.c: worker threads kept between calls (a token step makes about 200 products and teams: creating
 * threads for each cost more than the small ones take). */
#ifndef MINILLAMA_THREADPOOL_H
#define MINILLAMA_THREADPOOL_H

/* Runs fn(ctx, part, parts) on the caller (part 0) and parts - 1 pool workers at once (parts <= threads: as many
 * as could be started, at most MQ_MAX_THREADS); returns parts. One team runs at a time. */
#define MQ_MAX_THREADS 64
typedef void (*mq_team_fn)(void *ctx, int part, int parts);
int mq_team(mq_team_fn fn, void *ctx, int threads);

#endif
