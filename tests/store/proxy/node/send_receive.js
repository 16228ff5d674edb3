// The official RocketMQ 5 Node.js client against rmq serve --grpc (tests/store/proxy/test_grpc_node.py):
// node send_receive.js HOST:PORT TOPIC GROUP sends three messages, receives and acks them, and prints
// {"sent": [ids], "got": [{id, body, tag}]} as JSON.
const { Producer, SimpleConsumer } = require('rocketmq-client-nodejs');
async function main() {
  const [endpoints, topic, group] = process.argv.slice(2);
  const producer = new Producer({ endpoints, });
  await producer.startup();
  const ids = [];
  for (let i = 0; i < 3; i++) {
    const r = await producer.send({ topic, tag: 'node', keys: ['k' + i], body: Buffer.from('node-' + i),
                                    properties: new Map([['lang', 'js']]) });
    ids.push(r.messageId);
  }
  await producer.shutdown();
  const consumer = new SimpleConsumer({ consumerGroup: group, endpoints,
                                        subscriptions: new Map().set(topic, '*'), awaitDuration: 2000 });
  await consumer.startup();
  const got = [];
  const end = Date.now() + 15000;
  while (got.length < 3 && Date.now() < end) {
    const messages = await consumer.receive(16, 20000);
    for (const m of messages) { got.push({ id: m.messageId, body: m.body.toString(), tag: m.tag }); await consumer.ack(m); }
  }
  await consumer.shutdown();
  console.log(JSON.stringify({ sent: ids, got }));
}
main().then(() => process.exit(0)).catch((e) => { console.error(e); process.exit(1); });
