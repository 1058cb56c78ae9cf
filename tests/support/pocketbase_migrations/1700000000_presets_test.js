/// The preset test's PocketBase (tests/e2e/test_presets_pocketbase.py): a `tasks` collection only a superuser may
/// list or view (the reconciler's token), that signed-in users may write (the agent's), seeded with a full page of
/// records so that a search reads a second page; and the agent's user.
migrate((app) => {
  const signedIn = "@request.auth.id != ''";
  const tasks = new Collection({
    type: "base",
    name: "tasks",
    listRule: null,
    viewRule: null,
    createRule: signedIn,
    updateRule: signedIn,
    deleteRule: signedIn,
    fields: [
      { name: "title", type: "text" },
      { name: "n", type: "number" },
      { name: "done", type: "bool" },
      { name: "due", type: "date" },
      { name: "meta", type: "json" },
      { name: "created", type: "autodate", onCreate: true, onUpdate: false },
    ],
  });
  app.save(tasks);
  for (let i = 0; i < 1000; i++) {
    const seed = new Record(tasks);
    seed.set("title", "seed " + i);
    app.save(seed);
  }
  const agent = new Record(app.findCollectionByNameOrId("users"));
  agent.set("email", "agent@example.com");
  agent.setPassword("agent-password-1");
  app.save(agent);
});
