// One topic subscription and its filter rules, from one entry of the emulator's Config.json
// (emulator property names mapped to ARM ones).

@description('Name of the existing Service Bus namespace.')
param namespaceName string

@description('Name of the existing topic.')
param topicName string

@description('The subscription as written in infra/servicebus-emulator/Config.json: { Name, Properties, Rules }.')
param subscription object

@description('Deploy it; false: nothing (a subscription the deployment does not use, such as teams without Teams).')
param deploy bool = true

resource namespace 'Microsoft.ServiceBus/namespaces@2022-10-01-preview' existing = {
  name: namespaceName
}

resource topic 'Microsoft.ServiceBus/namespaces/topics@2022-10-01-preview' existing = {
  parent: namespace
  name: topicName
}

resource topicSubscription 'Microsoft.ServiceBus/namespaces/topics/subscriptions@2022-10-01-preview' = if (deploy) {
  parent: topic
  name: subscription.Name
  properties: {
    deadLetteringOnMessageExpiration: subscription.Properties.DeadLetteringOnMessageExpiration
    defaultMessageTimeToLive: subscription.Properties.DefaultMessageTimeToLive
    lockDuration: subscription.Properties.LockDuration
    maxDeliveryCount: subscription.Properties.MaxDeliveryCount
    // The emulator writes "" for "no forwarding"; ARM wants the property absent.
    forwardDeadLetteredMessagesTo: empty(subscription.Properties.ForwardDeadLetteredMessagesTo) ? null : subscription.Properties.ForwardDeadLetteredMessagesTo
    forwardTo: empty(subscription.Properties.ForwardTo) ? null : subscription.Properties.ForwardTo
    requiresSession: subscription.Properties.RequiresSession
  }
}

// A subscription created through ARM starts with a $Default rule (1=1); Service Bus drops it
// when the first rule is added through ARM, so only these rules filter the subscription.
// Only SQL filters are mapped: tests/infra/test_infra_entities.py fails on any other FilterType.
resource rules 'Microsoft.ServiceBus/namespaces/topics/subscriptions/rules@2022-10-01-preview' = [for rule in (deploy ? subscription.Rules : []): {
  parent: topicSubscription
  name: rule.Name
  properties: {
    filterType: 'SqlFilter'
    sqlFilter: {
      sqlExpression: rule.Properties.SqlFilter.SqlExpression
    }
  }
}]

@description('Resource id of the subscription (empty when it is not deployed).')
output id string = deploy ? topicSubscription.id : ''
