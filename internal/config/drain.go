package config

// DrainTokenEnv names the environment variable that carries the sidecar's drain token: the one
// GET /drain on the admin port requires, as "Authorization: Bearer <token>". The chart, inject and
// the injector generate one per pod and put it there and in the application's preStop hook.
const DrainTokenEnv = "LOADSHED_DRAIN_TOKEN"
